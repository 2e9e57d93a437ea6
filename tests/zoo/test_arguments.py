"""The plain arguments of zoo.fit (zoo.arguments): each bad value is refused before any
work, with what was given and what to pass instead."""

import pytest
import torch

import guides
import zoo
from zoo.models import BayesianMLP


def data(n=40):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 3, generator=g)
    return x, x[:, 0]


def fit(model=None, guide="diagonal", **options):
    options.setdefault("num_steps", 2)
    model = BayesianMLP(3, (4,), noise=1.0) if model is None else model
    return zoo.fit(model, guide, data(), run=zoo.Run(progress=False), **options)


@pytest.mark.parametrize("seed", ["abc", 1.5, 2**70, -1, True])
def test_a_seed_that_is_not_an_integer_in_range_is_refused(seed):
    with pytest.raises(
        ValueError, match="seed must be None .* or an integer in \\[0, 2\\*\\*63\\)"
    ):
        fit(seed=seed)


def test_the_largest_seed_and_none_are_taken():
    assert fit(seed=2**63 - 1).steps == 2
    assert fit(seed=None).steps == 2


def test_epochs_and_num_steps_together_are_refused():
    with pytest.raises(ValueError, match="pass epochs= or num_steps=, not both"):
        fit(epochs=1, num_steps=5)


@pytest.mark.parametrize(
    "model, phrase",
    [
        (None, "model must be a Pyro model"),
        ("model", "model must be a Pyro model"),
        (torch.nn.Linear(3, 1), "plain torch module \\(Linear\\).*from_module"),
    ],
    ids=["None", "str", "nn.Linear"],
)
def test_what_cannot_be_a_model_is_refused(model, phrase):
    with pytest.raises(TypeError, match=phrase):
        zoo.fit(model, "diagonal", data(), num_steps=2, run=zoo.Run(progress=False))


def test_a_guide_built_for_another_model_is_refused():
    from pyro.infer.autoguide import AutoNormal

    other = BayesianMLP(5, (4,), noise=1.0)
    for guide in (guides.get("diagonal")(other), AutoNormal(other)):
        with pytest.raises(ValueError, match="the guide was built for another model"):
            fit(guide=guide)
    mine = BayesianMLP(3, (4,), noise=1.0)
    assert fit(model=mine, guide=AutoNormal(mine)).steps == 2


def test_a_checkpoint_path_that_cannot_be_written_is_refused_before_training(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(ValueError, match="its folder cannot be made"):
        zoo.fit(
            BayesianMLP(3, (4,), noise=1.0), "diagonal", data(), num_steps=2,
            run=zoo.Run(progress=False, checkpoint=blocker / "sub" / "fit.ckpt"),
        )  # fmt: skip
    with pytest.raises(ValueError, match="is a folder"):
        zoo.fit(BayesianMLP(3, (4,), noise=1.0), "diagonal", data(), num_steps=2,
                run=zoo.Run(progress=False, checkpoint=tmp_path))  # fmt: skip
