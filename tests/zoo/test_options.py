"""The option groups (zoo.options): defaults, checks before any work, dicts, and the deprecated
flat keywords of earlier releases, which must give the same fit as the groups."""

import dataclasses

import pytest
import torch

import guides
import zoo
from zoo.models import BayesianMLP
from zoo.options import GROUPS, flat_keywords, group


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


def test_flat_keywords_still_work_with_a_warning_naming_the_group():
    """The same fit, step for step, whichever way its options are given."""
    common = dict(num_steps=6, batch_size=8, seed=1)
    with pytest.warns(DeprecationWarning) as caught:
        old = zoo.fit(
            BayesianMLP(3, (4,), 1),
            "lowrank",
            data(),
            guide_options={"rank": 2},
            optimizer="sgd",
            kl_weight=0.5,
            jit=False,
            progress=False,
            **common,
        )
    text = " ".join(str(w.message) for w in caught)
    for hint in ("guides.family", "optim=zoo.Optim", "loss=zoo.Loss", "engine=zoo.Engine"):
        assert hint in text
    new = zoo.fit(
        BayesianMLP(3, (4,), 1),
        guides.family("lowrank", rank=2),
        data(),
        optim=zoo.Optim(optimizer="sgd"),
        loss={"kl_weight": 0.5},
        engine=zoo.Engine(jit=False),
        run=zoo.Run(progress=False),
        **common,
    )
    assert old.losses == new.losses and old.options == new.options


def test_the_lightning_module_takes_the_same_groups():
    pytest.importorskip("lightning")
    from zoo.lightning import BayesianModule

    x, y = data()
    module = BayesianModule(
        BayesianMLP(3, (4,), 1), "diagonal", 40, example=(x, y), loss=zoo.Loss(elbo="meanfield")
    )
    assert module.objective.elbo == "meanfield"
    with pytest.warns(DeprecationWarning, match="loss=zoo.Loss"):
        BayesianModule(BayesianMLP(3, (4,), 1), "diagonal", 40, example=(x, y), elbo="meanfield")
