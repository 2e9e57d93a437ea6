"""Checkpoints (zoo.training.checkpoint, zoo.data.fingerprint): a resume continues the same fit
or is refused with what differs; a checkpoint whose loop state no fit writes is refused before any
step."""

import shutil

import pyro
import pytest
import torch

import guides
import zoo
from zoo.models import BayesianMLP
from zoo.storage import files


def data(n=300, shift=0.0):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 3, generator=g)
    return x + shift, x[:, 0] - x[:, 1]


def model():
    return BayesianMLP(3, (8,), noise=1.0)


def fit(guide="lowrank", data_=None, model_=None, **run):
    options = dict(num_steps=run.pop("num_steps", 20), batch_size=run.pop("batch_size", 25))
    return zoo.fit(
        model_ or model(), guide, data_ if data_ is not None else data(), **options,
        optim=run.pop("optim", None), run=zoo.Run(progress=False, **run),
    )  # fmt: skip


@pytest.fixture(scope="module")
def _checkpoint_folder(tmp_path_factory):
    """The folder of one low-rank fit's checkpoint, fitted once for the module from the seed
    every test starts at (the tests' own ``_fresh_rng``)."""
    folder = tmp_path_factory.mktemp("checkpoint")
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    fit("lowrank", num_steps=9, checkpoint=folder / "fit.ckpt", checkpoint_every=9)
    return folder


@pytest.fixture
def checkpoint(_checkpoint_folder, tmp_path):
    """A low-rank fit's checkpoint, 9 steps into an epoch of 12 (batch 25 of 300): a copy of
    the module's (with what the fit wrote beside it) in the test's own folder, to edit."""
    for path in _checkpoint_folder.iterdir():
        shutil.copy2(path, tmp_path / path.name)
    return tmp_path / "fit.ckpt"


def test_a_resume_with_a_larger_batch_is_refused_not_spun(checkpoint):
    """Batch 100 gives 3 steps an epoch; the checkpoint is 9 into one: the loop would skip
    every batch of every epoch for ever."""
    with pytest.raises(ValueError, match="batch_size=25 in the checkpoint, 100 now"):
        fit("lowrank", batch_size=100, resume=checkpoint)


def test_a_resume_on_other_data_is_refused(checkpoint):
    with pytest.raises(ValueError, match="the data differ \\(the same size"):
        fit("lowrank", data(shift=1.0), resume=checkpoint)
    with pytest.raises(ValueError, match="300 examples in the checkpoint, 200 now"):
        fit("lowrank", data(200), resume=checkpoint)


def test_a_resume_with_another_learning_rate_or_optimiser_is_refused(checkpoint, tmp_path):
    # small regression data: the full-batch recipe's rate, 1e-2 decaying, a setting
    with pytest.raises(ValueError, match="lr=0.01 in the checkpoint, 0.001 now"):
        zoo.fit(model(), "lowrank", data(), num_steps=20, batch_size=25, lr=0.001,
                run=zoo.Run(progress=False, resume=checkpoint))  # fmt: skip
    with pytest.raises(ValueError, match="lr_schedule='exponential' in the checkpoint, None now"):
        zoo.fit(model(), "lowrank", data(), num_steps=20, batch_size=25, lr=0.01,
                run=zoo.Run(progress=False, resume=checkpoint))  # fmt: skip
    with pytest.raises(ValueError, match="lr=0.01 in the checkpoint, 'auto' now"):
        zoo.fit(model(), "lowrank", data(), num_steps=20, batch_size=25, lr="auto",
                run=zoo.Run(progress=False, resume=checkpoint))  # fmt: skip
    # a classifier's rate left to the fit is not a setting: "default" is recorded
    x, y = data()
    labels, classifier = (y > 0).long(), BayesianMLP(3, (8,), 2, task="classification")
    measured = tmp_path / "measured.ckpt"
    fit("lowrank", (x, labels), classifier, num_steps=9, checkpoint=measured, checkpoint_every=9)
    with pytest.raises(ValueError, match="lr='default' in the checkpoint, 0.001 now"):
        zoo.fit(classifier, "lowrank", (x, labels), num_steps=20, batch_size=25, lr=0.001,
                run=zoo.Run(progress=False, resume=measured))  # fmt: skip
    with pytest.raises(ValueError, match="optimizer='adam' in the checkpoint, 'sgd' now"):
        fit("lowrank", optim=zoo.Optim(optimizer="sgd"), resume=checkpoint)


def test_a_longer_run_resumes(checkpoint):
    resumed = fit("lowrank", num_steps=20, resume=checkpoint)
    assert resumed.steps == 20


@pytest.mark.parametrize(
    "guide",
    [
        "tridiagonal",
        guides.family("tridiagonal"),
        guides.family("lowrank", rank=3),
        lambda m: guides.get("diagonal")(m),
        "instance",
    ],
    ids=["name", "family", "other-options", "factory", "instance"],
)
def test_a_resume_with_another_family_or_its_options_is_refused(checkpoint, guide):
    """However the guide comes (the CLI passes guides.family): a fit of one family must never
    continue another's checkpoint and be saved under its name."""
    net = model()
    if guide == "instance":
        guide = guides.get("matrix_normal")(net)
    with pytest.raises(ValueError, match="checkpoint of the 'lowrank' family") as err:
        fit(guide, model_=net, resume=checkpoint)
    assert "guides.family('lowrank', rank=10" in str(err.value)


def test_the_same_family_given_any_way_resumes(checkpoint):
    assert fit(guides.family("lowrank", rank=10), resume=checkpoint).steps == 20
    net = model()
    assert fit(guides.get("lowrank")(net), model_=net, resume=checkpoint).steps == 20


def rewrite(path, change) -> None:
    """The checkpoint at ``path`` with ``change(payload)`` applied and its checksum recomputed,
    as one who knows the format would rewrite it."""
    payload = torch.load(path, weights_only=True)
    change(payload)
    files.atomic_save(payload, path)


@pytest.mark.parametrize(
    "field, value, phrase",
    [
        ("step", -5, "step is -5, not a count"),
        ("step", 2.5, "step is 2.5, not a count"),
        ("epoch", -1, "epoch is -1"),
        ("done_in_epoch", 50, "stopped 50 steps into an epoch, but an epoch of this fit has 12"),
        ("losses", [1.0], "step is 9 but it holds 1 losses"),
    ],
)
def test_a_changed_loop_state_is_refused_before_any_step(checkpoint, field, value, phrase):
    rewrite(checkpoint, lambda payload: payload["state"].__setitem__(field, value))
    with pytest.raises(ValueError, match=phrase):
        fit("lowrank", resume=checkpoint)


@pytest.mark.parametrize("entry", ["optimizer", "state", "guide"])
def test_a_checkpoint_without_an_entry_names_it(checkpoint, entry):
    rewrite(checkpoint, lambda payload: payload.pop(entry))
    with pytest.raises(ValueError, match=f"'{entry}'|before version"):
        fit("lowrank", resume=checkpoint)


def test_a_checkpoint_records_the_data_and_the_settings(checkpoint):
    payload = torch.load(checkpoint, weights_only=True)
    identity = payload["identity"]
    assert identity["data"]["size"] == 300 and len(identity["data"]["digest"]) == 64
    assert identity["settings"]["batch_size"] == 25
    assert identity["settings"]["optimizer"] == "adam"


@pytest.mark.parametrize("change", ["shape", "nan", "groups"])
def test_an_optimiser_state_that_does_not_fit_is_refused(checkpoint, change):
    def damage(payload):
        state = payload["optimizer"]["state"]
        first = next(iter(state))
        if change == "shape":
            state[first]["exp_avg"] = torch.zeros(7)
        elif change == "nan":
            state[first]["exp_avg_sq"] = torch.full_like(state[first]["exp_avg_sq"], float("nan"))
        else:
            groups = payload["optimizer"]["param_groups"]
            groups.append(dict(groups[0]))

    rewrite(checkpoint, damage)
    with pytest.raises(ValueError, match=f"{checkpoint}: the checkpoint's optimiser"):
        fit("lowrank", resume=checkpoint)


def test_a_changed_checkpoint_fails_its_checksum(checkpoint):
    payload = torch.load(checkpoint, weights_only=True)
    payload["state"]["step"] = 3
    torch.save(payload, checkpoint)
    with pytest.raises(ValueError, match="is damaged: its contents do not match the checksum"):
        fit("lowrank", resume=checkpoint)


def test_a_resume_with_another_seed_is_refused(checkpoint):
    """The checkpoint carries seed 0's random streams: resumed with seed 10 it would return the
    seed-0 fit labelled seed 10 (a seed sweep over one checkpoint path, one fit many times)."""
    with pytest.raises(ValueError, match="seed=0 in the checkpoint, 10 now"):
        zoo.fit(model(), "lowrank", data(), num_steps=20, batch_size=25, seed=10,
                run=zoo.Run(progress=False, resume=checkpoint))  # fmt: skip


def test_a_resume_with_another_shuffle_is_refused(tmp_path):
    """A DataLoader with shuffle=True does not continue a shuffle=False checkpoint."""
    from torch.utils.data import DataLoader, TensorDataset

    x, y = data()
    path = tmp_path / "loader.ckpt"
    fit("diagonal", DataLoader(TensorDataset(x, y), batch_size=25), num_steps=5, checkpoint=path)
    shuffled = DataLoader(TensorDataset(x, y), batch_size=25, shuffle=True)
    with pytest.raises(ValueError, match="SequentialSampler.*RandomSampler"):
        fit("diagonal", shuffled, num_steps=10, resume=path)


def test_a_resume_on_a_dataset_with_flipped_labels_is_refused(tmp_path):
    """Every item of a small map-style Dataset is hashed: labels changed anywhere are found
    (three items were once all that was read)."""

    class Rows(torch.utils.data.Dataset):
        def __init__(self, x, y):
            self.x, self.y = x, y

        def __len__(self):
            return len(self.x)

        def __getitem__(self, i):
            return self.x[i], self.y[i]

    x, y = data(200)
    path = tmp_path / "rows.ckpt"
    fit("diagonal", Rows(x, y), num_steps=5, checkpoint=path)
    flipped = y.clone()
    flipped[1:197:2] *= -1  # 98 of the 200 targets
    with pytest.raises(ValueError, match="the data differ"):
        fit("diagonal", Rows(x, flipped), num_steps=10, resume=path)
    order = torch.randperm(200, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="the data differ"):
        fit("diagonal", Rows(x[order], y[order]), num_steps=10, resume=path)


def test_a_checkpoint_without_its_identity_is_refused(checkpoint):
    """Deleting the identity does not turn the check off: every checkpoint of this format
    records one."""
    rewrite(checkpoint, lambda payload: payload.pop("identity"))
    with pytest.raises(ValueError, match="has no identity"):
        fit("lowrank", resume=checkpoint)


@pytest.mark.parametrize(
    "other, part",
    [
        (lambda: BayesianMLP(3, (8,), noise=1.0, prior=0.01), "prior"),
        (lambda: BayesianMLP(3, (8,), noise=1.0, activation="tanh"), "network"),
        (lambda: BayesianMLP(3, (8,), noise=0.5), "likelihood"),
    ],
    ids=["prior", "activation", "noise"],
)
def test_a_resume_with_another_model_of_the_same_shapes_is_refused(checkpoint, other, part):
    with pytest.raises(ValueError, match=f"the model differs \\(its {part}"):
        fit("lowrank", model_=other(), resume=checkpoint)


def test_a_resume_with_another_batch_norm_is_refused(tmp_path):
    from torch import nn

    def net(momentum=0.1, eps=1e-5):
        return nn.Sequential(nn.Linear(3, 8), nn.BatchNorm1d(8, eps=eps, momentum=momentum),
                             nn.ReLU(), nn.Linear(8, 1))  # fmt: skip

    torch.manual_seed(0)
    base = net()
    path = tmp_path / "bn.ckpt"
    convert = zoo.models.from_module
    fit(
        "diagonal",
        model_=convert(base, task="regression", init="module"),
        num_steps=4,
        checkpoint=path,
    )
    for changed in (net(momentum=0.5), net(eps=1e-3)):
        changed.load_state_dict(base.state_dict())
        with pytest.raises(ValueError, match="the model differs \\(its network"):
            fit("diagonal", model_=convert(changed, task="regression", init="module"), resume=path)
    assert (
        fit("diagonal", model_=convert(base, task="regression", init="module"), resume=path).steps
        == 20
    )


@pytest.mark.parametrize(
    "remove, named",
    [
        (lambda identity: identity["settings"].pop("seed"), "settings.seed"),
        (lambda identity: identity.pop("data"), "data"),
        (lambda identity: identity.pop("model"), "model"),
        (lambda identity: identity.pop("settings"), "settings"),
    ],
    ids=["seed", "data", "model", "settings"],
)
def test_a_partial_identity_is_refused_naming_what_is_missing(checkpoint, remove, named):
    rewrite(checkpoint, lambda payload: remove(payload["identity"]))
    with pytest.raises(ValueError, match=f"identity without {named}.*the file was changed"):
        fit("lowrank", resume=checkpoint)


@pytest.mark.parametrize("entry", ["data", "model", "data.digest"])
def test_a_re_signed_identity_without_its_data_or_model_is_refused(checkpoint, entry):
    """An identity entry set to None (or a part of the data's record dropped) and the file
    re-signed, as one who knows the format would: the comparison it stood for is not switched
    off, the resume on 300 other examples is refused."""
    payload = torch.load(checkpoint, weights_only=True)
    key, _, part = entry.partition(".")
    if part:
        del payload["identity"][key][part]
    else:
        payload["identity"][key] = None
    files.atomic_save(payload, checkpoint)
    with pytest.raises(ValueError, match=rf"has an identity without {entry}\b"):
        fit("lowrank", data(shift=1.0), resume=checkpoint)
