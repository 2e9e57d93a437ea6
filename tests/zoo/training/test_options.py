"""The option groups (zoo.training.options): defaults, checks before any work, dicts, and the flat
keywords of earlier releases, refused naming the group."""

import dataclasses

import pytest
import torch

import zoo
from zoo.models import BayesianMLP
from zoo.training.options import GROUPS, flat_keywords, group


def data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 3, generator=g)
    return x, x.sum(1)


def test_every_field_belongs_to_one_group_and_defaults_are_fits():
    owners = flat_keywords()
    assert len(owners) == sum(len(dataclasses.fields(c)) for c in GROUPS.values())
    defaults = {f.name: f.default for f in dataclasses.fields(zoo.Engine)}
    assert defaults["device"] == "auto" and zoo.Run().progress is True
    assert group(zoo.Run, {"progress": False}) == zoo.Run(progress=False)
    with pytest.raises(TypeError, match=r"Run has no option \['progres'\]"):
        group(zoo.Run, {"progres": False})


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: zoo.Engine(accumulate=0), "accumulate must be a positive integer"),
        (lambda: zoo.Engine(check_every=0), "check_every must be 'auto' or a positive integer"),
        (lambda: zoo.Engine(jit="yes"), "jit must be 'auto', True or False"),
        (lambda: zoo.Engine(threads=0), "threads must be 'auto', None or a positive int"),
        (lambda: zoo.Loss(elbo="exact"), "elbo must be 'trace' or 'meanfield'"),
        (lambda: zoo.Loss(num_particles=0), "num_particles must be a positive integer"),
        (lambda: zoo.Optim(optimizer="lbfgs"), "optimizer must be one of"),
        (lambda: zoo.Run(on_divergence="ignore"), "on_divergence must be 'raise' or 'skip'"),
        (lambda: zoo.Run(checkpoint_every=1.5), "checkpoint_every must be a positive integer"),
    ],
)
def test_a_bad_option_fails_when_its_group_is_built(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_a_group_field_passed_on_its_own_is_refused_naming_its_group():
    """The flat keywords removed in 0.3.0: a clear error before any work, saying where the
    option goes."""
    model = BayesianMLP(3, (4,), 1)
    with pytest.raises(TypeError) as err:
        zoo.fit(model, "diagonal", data(), num_steps=2, optimizer="sgd", jit=False)
    for hint in ("optimizer= in optim=zoo.Optim(optimizer=...)", "engine=zoo.Engine(jit=...)"):
        assert hint in str(err.value)
    with pytest.raises(TypeError, match=r"guides.family\(name, \*\*options\)"):
        zoo.fit(model, "lowrank", data(), num_steps=2, guide_options={"rank": 2})
    assert not any(p.grad is not None for p in model.parameters())  # nothing ran
    with pytest.raises(TypeError, match="unexpected keyword argument 'sped'"):
        zoo.fit(model, "diagonal", data(), num_steps=2, sped=3)  # not a field: Python's error


def test_the_lightning_module_takes_the_same_groups():
    pytest.importorskip("lightning")
    from zoo.lightning import BayesianModule

    x, y = data()
    module = BayesianModule(
        BayesianMLP(3, (4,), 1), "diagonal", 40, example=(x, y), loss=zoo.Loss(elbo="meanfield")
    )
    assert module.objective.elbo == "meanfield"
    with pytest.raises(TypeError, match=r"loss=zoo.Loss\(elbo=...\)"):
        BayesianModule(BayesianMLP(3, (4,), 1), "diagonal", 40, example=(x, y), elbo="meanfield")
