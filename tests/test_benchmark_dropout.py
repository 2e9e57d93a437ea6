"""The MC dropout study of ``benchmarks/mnist_accuracy.py`` and its plain-PyTorch reference
(``benchmarks/dropout_reference.py``): the reference's L2 penalty is the family's KL, and the
study runs at a tiny size."""

import math
import sys

import pytest
import torch

from guides.families.mc_dropout import MCDropoutWeight, dropout_kl
from tests.conftest import REPO
from tests.test_benchmarks import _run

sys.path.insert(0, str(REPO / "benchmarks"))
import dropout_reference  # noqa: E402

pytestmark = pytest.mark.slow  # runs a benchmark script


def test_the_reference_penalty_is_the_familys_kl_in_torchs_weights():
    """``W_torch = (1 - p) M``: the penalty's change between two weights is the change of Gal's
    KL to ``N(0, s^2)`` (the KL's constants cancel), computed by the family's own code."""
    p, s = 0.2, 0.7
    net = dropout_reference.DropoutLeNet5({"conv2": p, "fc1": p, "fc2": p, "conv1": p})
    scale = torch.tensor(s, dtype=torch.float64)

    def kl(weight, bias):  # the family's KL of M = W / (1 - p), the L2 term of the bias
        q = MCDropoutWeight(weight.double() / (1 - p), p, 1e-3)
        return float(dropout_kl(q, torch.zeros((), dtype=torch.float64), scale)) + float(
            bias.pow(2).sum()
        ) / (2 * s**2)

    with torch.no_grad():
        penalty_before = float(net.penalty(s))
        kl_before = sum(kl(m.weight, m.bias) for _, m in _layers(net))
        for _, layer in _layers(net):
            layer.weight.mul_(1.5).add_(0.01)
            layer.bias.mul_(-2.0)
        change = float(net.penalty(s)) - penalty_before
        kl_change = sum(kl(m.weight, m.bias) for _, m in _layers(net)) - kl_before
    assert math.isclose(change, kl_change, rel_tol=1e-5)


def _layers(net):
    return [(n, getattr(net, n)) for n in dropout_reference.DropoutLeNet5.LAYERS]


def test_the_reference_keeps_dropout_at_test_time_and_the_callers_random_state():
    net = dropout_reference.DropoutLeNet5({"fc1": 0.5})
    x = torch.randn(4, 1, 28, 28)
    state = torch.get_rng_state()
    a, b = (dropout_reference.predict(net, x, 1, seed=s).probs for s in (0, 1))
    assert torch.equal(torch.get_rng_state(), state)
    assert not torch.allclose(a, b)  # other masks, other outputs
    assert torch.allclose(a.sum(-1), torch.ones(4))


def test_the_dropout_study_prints_every_row(mnist_root):
    args = ["--data", str(mnist_root), "--train-limit", "256", "--test-limit", "64"]
    out = _run("benchmarks/mnist_accuracy.py", "--dropout-study", *args, "--samples", "2")
    for row in ("a mask per step", "a mask per image", "plain PyTorch dropout", "diagonal", "map"):
        assert f"| {row}" in out or row in out
    assert out.count("| mc_dropout,") == 4 and out.count("| plain PyTorch") == 2
