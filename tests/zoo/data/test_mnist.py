"""LeNet-5 on real MNIST (a subset, to keep the suite fast on two CPU cores)."""

import pytest
import torch

import guides
import zoo
from tests.families import GAUSSIAN, PRIMARY

pytestmark = pytest.mark.slow  # fits on MNIST

# The families that learn a spread (variances, correlations) that could collapse or blow up;
# every variant runs on small sites in tests/guides, and MC dropout and the point mass (a fixed
# spread, none) fit MNIST in notebook 07's test run.
FAMILIES = {label: case for label, case in PRIMARY.items() if label in GAUSSIAN}


@pytest.fixture(scope="module")
def mnist_subset(mnist_root):
    train = zoo.data.mnist(mnist_root, limit=12_000)
    test = zoo.data.mnist(mnist_root, train=False, limit=2_000)
    return train, test


def test_lenet_diagonal_learns_mnist(mnist_subset):
    train, test = mnist_subset
    fit = zoo.fit(
        zoo.models.LeNet5(),
        "diagonal",
        train,
        epochs=1,
        run=zoo.Run(progress=False),
    )
    metrics = fit.evaluate(test, num_samples=20)
    assert metrics["accuracy"] >= 0.90, metrics
    assert 0 <= metrics["ece"] < 0.1 and metrics["nll"] < 0.4


@pytest.mark.parametrize("family", list(FAMILIES))
def test_500_lenet_steps_stay_finite(family, mnist_subset):
    train, _ = mnist_subset
    name, options = FAMILIES[family]
    options = dict(options)
    if family == "tridiagonal":  # the posch parameterisation
        # means initialised near zero: the variance tau^2 m^2 must not collapse or blow up
        options["init_loc_fn"] = lambda site: 1e-4 * torch.randn_like(site["value"])
    fit = zoo.fit(
        zoo.models.LeNet5(),
        guides.family(name, **options),
        train,
        num_steps=500,
        batch_size=32,
        run=zoo.Run(progress=False),
    )
    assert fit.fitting()["steps"] == 500  # the rate test's steps are the budget's
    assert all(torch.isfinite(torch.tensor(fit.losses)))
    for p in fit.guide.parameters():
        assert torch.isfinite(p).all()
    pred = fit.predict(train.tensors[0][:64], num_samples=4)
    assert torch.isfinite(pred.probs).all()
