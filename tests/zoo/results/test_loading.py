"""Save and load, checkpoints, interruption and resumption."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyro
import pytest
import torch

import guides
import zoo
from tests.conftest import HANG_AFTER
from tests.families import CASES
from zoo.models import BayesianMLP
from zoo.storage import files

FAMILIES = CASES
LEGACY = Path(__file__).resolve().parents[2] / "data" / "legacy_v1"


def data(n=64):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 3, generator=g)
    return x, (x[:, 0] > 0).long() + (x[:, 1] > 0).long()


def model():
    return BayesianMLP(3, (8,), 3, task="classification")


OPTIONS = dict(
    batch_size=16,
    lr=0.01,
    seed=7,
    optim=zoo.Optim(lr_schedule=lambda i: 1 / (1 + 0.01 * i)),
    loss=zoo.Loss(num_particles=2),
)
QUIET = zoo.Run(progress=False)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_save_load_round_trip_gives_identical_predictions(family, tmp_path):
    name, options = FAMILIES[family]
    fit = zoo.fit(
        model(), guides.family(name, **options), data(), num_steps=10, **OPTIONS, run=QUIET
    )
    path = fit.save(tmp_path / "fit.pt")
    loaded = zoo.load(path)
    assert type(loaded.guide) is type(fit.guide)
    assert loaded.losses == fit.losses
    x = data()[0][:9]
    pyro.set_rng_seed(5)
    before = fit.predict(x, num_samples=6).outputs
    pyro.set_rng_seed(5)
    after = loaded.predict(x, num_samples=6).outputs
    assert torch.equal(before, after)
    # the loaded guide is independent of the original one
    with torch.no_grad():
        next(iter(fit.guide.parameters())).add_(1.0)
    assert not torch.equal(
        fit.guide.median()[fit.guide.site_names[0]],
        loaded.guide.median()[loaded.guide.site_names[0]],
    )


def test_loading_onto_a_different_model_is_refused(tmp_path):
    fit = zoo.fit(model(), "diagonal", data(), num_steps=2, **OPTIONS, run=QUIET)
    path = fit.save(tmp_path / "fit.pt")
    other = BayesianMLP(3, (5,), 3, task="classification")
    with pytest.raises(ValueError, match="different model.*fc1.weight: \\(8, 3\\) vs \\(5, 3\\)"):
        zoo.load(path, model=other)
    same_shape = model()
    assert zoo.load(path, model=same_shape).model is same_shape


def test_not_a_zoo_file(tmp_path):
    torch.save({"a": 1}, tmp_path / "x.pt")
    with pytest.raises(
        ValueError, match="not a bnn-zoo draws, ensemble, fit, laplace or reference file"
    ):
        zoo.load(tmp_path / "x.pt")
    with pytest.raises(FileNotFoundError):
        zoo.load(tmp_path / "missing.pt")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes")
def test_a_named_pipe_or_a_folder_at_the_path_is_refused_without_reading(tmp_path):
    """A FIFO blocks its first read until a writer comes, for ever: refused from its file type,
    in a child with a deadline so that a regression fails instead of hanging."""
    os.mkfifo(tmp_path / "pipe.pt")
    (tmp_path / "folder.pt").mkdir()
    script = textwrap.dedent(
        f"""
        import zoo
        for name in ("pipe.pt", "folder.pt"):
            try:
                zoo.load({str(tmp_path)!r} + "/" + name)
            except ValueError as err:
                print(err)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert "pipe.pt is not a regular file (it is a named pipe)" in lines[0]
    assert "folder.pt is not a regular file (it is a folder)" in lines[1]
    assert "give the path of such a file" in lines[1]


@pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")
def test_atomic_save_gives_the_mode_of_a_plain_open_and_keeps_a_replaced_files_mode(tmp_path):
    with open(tmp_path / "plain", "wb"):
        pass
    files.atomic_save({"a": 1}, tmp_path / "new.pt")
    assert (tmp_path / "new.pt").stat().st_mode & 0o777 == (
        tmp_path / "plain"
    ).stat().st_mode & 0o777
    os.chmod(tmp_path / "new.pt", 0o640)
    files.atomic_save({"a": 2}, tmp_path / "new.pt")
    assert (tmp_path / "new.pt").stat().st_mode & 0o777 == 0o640
    assert torch.load(tmp_path / "new.pt")["a"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.pt", "plain"]  # no temporaries


def test_interrupt_then_resume_equals_an_uninterrupted_fit(tmp_path):
    full = zoo.fit(model(), "tridiagonal", data(), num_steps=30, **OPTIONS, run=QUIET)

    def ctrl_c(state):
        if state.step == 13:  # mid-epoch: 4 batches per epoch
            raise KeyboardInterrupt

    ckpt = tmp_path / "ckpt.pt"
    part = zoo.fit(
        model(),
        "tridiagonal",
        data(),
        num_steps=30,
        **OPTIONS,
        run=zoo.Run(progress=False, checkpoint=ckpt, callbacks=[ctrl_c]),
    )
    assert part.interrupted and part.steps == 13
    resumed = zoo.fit(
        model(),
        "tridiagonal",
        data(),
        num_steps=30,
        **OPTIONS,
        run=zoo.Run(progress=False, resume=ckpt),
    )
    assert resumed.steps == 30
    assert resumed.losses == pytest.approx(full.losses, rel=1e-6)
    for a, b in zip(full.guide.parameters(), resumed.guide.parameters()):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-7)


CHILD = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {tests!r})
    import zoo
    from test_loading import OPTIONS, data, model
    zoo.fit(model(), "diagonal", data(), num_steps=400, **OPTIONS,
            engine=zoo.Engine(device="cpu"),
            run=zoo.Run(progress=False, checkpoint={ckpt!r}, checkpoint_every=3,
                        callbacks=[lambda s: time.sleep(0.005)]))
    """
)


@pytest.mark.slow  # quick tier: under three minutes
def test_sigkill_mid_fit_then_resume(tmp_path):
    ckpt = tmp_path / "ckpt.pt"
    script = CHILD.format(tests=os.path.dirname(__file__), ckpt=str(ckpt))
    child = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.time() + 120
        while not ckpt.exists() and time.time() < deadline and child.poll() is None:
            time.sleep(0.05)
        assert ckpt.exists(), "the child never wrote a checkpoint"
        # Read the checkpoint while it is being rewritten: it is never half-written.
        reads = 0
        end = time.time() + 1.0
        while time.time() < end:
            files.read(ckpt, "checkpoint")
            reads += 1
        assert child.poll() is None, "the child finished before it could be killed"
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=HANG_AFTER)
    finally:
        if child.poll() is None:
            child.kill()
    assert reads > 0
    stopped_at = files.read(ckpt, "checkpoint")["state"]["step"]
    assert 0 < stopped_at < 400
    resumed = zoo.fit(
        model(),
        "diagonal",
        data(),
        num_steps=400,
        **OPTIONS,
        run=zoo.Run(progress=False, resume=ckpt),
    )
    full = zoo.fit(model(), "diagonal", data(), num_steps=400, **OPTIONS, run=QUIET)
    assert resumed.steps == 400
    for a, b in zip(full.guide.parameters(), resumed.guide.parameters()):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_saved_files_are_plain_data_and_small(family, tmp_path):
    """Read with weights_only=True (no code runs); parameters plus history, nothing else."""
    name, options = FAMILIES[family]
    fit = zoo.fit(
        model(), guides.family(name, **options), data(), num_steps=10, **OPTIONS, run=QUIET
    )
    path = fit.save(tmp_path / "fit.pt")
    payload = torch.load(path, weights_only=True)
    assert payload["guide"]["spec"]["family"] == name
    assert payload["model"]["spec"]["class"] == "BayesianMLP"
    params = sum(p.numel() * p.element_size() for p in fit.guide.parameters())
    history = 8 * (len(fit.losses) + len(fit.epoch_losses))
    # + the file's fixed overhead and the options' text (what ran and why: a few hundred bytes)
    assert path.stat().st_size <= 1.2 * (params + history) + 8192 + 512


def test_lenet_tridiagonal_save_is_at_most_1_2x_its_parameters(tmp_path):
    x, y = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
    fit = zoo.fit(
        zoo.models.LeNet5(),
        "tridiagonal",
        (x, y),
        num_steps=2,
        run=zoo.Run(progress=False),
    )
    path = fit.save(tmp_path / "lenet.pt")
    params = sum(p.numel() * p.element_size() for p in fit.guide.parameters())
    assert path.stat().st_size <= 1.2 * params + 8 * 4
    checkpoint = tmp_path / "ckpt.pt"
    zoo.fit(
        zoo.models.LeNet5(),
        "tridiagonal",
        (x, y),
        num_steps=1,
        run=zoo.Run(progress=False, checkpoint=checkpoint),
    )
    torch.load(checkpoint, weights_only=True)  # checkpoints are plain data too


def test_a_user_network_is_passed_again_on_load(tmp_path):
    net = torch.nn.Sequential(torch.nn.Linear(3, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))
    fit = zoo.fit(
        zoo.models.from_module(net, init="module"),
        "lowrank",
        data(),
        num_steps=5,
        **OPTIONS,
        run=QUIET,
    )
    path = fit.save(tmp_path / "fit.pt")
    with pytest.raises(ValueError, match="not a zoo.models class.*model="):
        zoo.load(path)
    loaded = zoo.load(path, model=zoo.models.from_module(net, init="module"))
    x = data()[0][:4]
    torch.testing.assert_close(loaded.guide.median()["0.weight"], fit.guide.median()["0.weight"])
    assert loaded.predict(x, num_samples=3, progress=False).probs.shape == (4, 3)


def test_a_model_of_another_architecture_is_refused_with_the_sites_that_differ(tmp_path):
    fit = zoo.fit(
        zoo.models.LeNet5(hidden=20),
        "diagonal",
        (torch.randn(4, 1, 28, 28), torch.randint(0, 10, (4,))),
        num_steps=1,
        run=zoo.Run(progress=False),
    )
    path = fit.save(tmp_path / "fit.pt")
    with pytest.raises(ValueError, match="different model"):
        zoo.load(path, model=model())  # an MLP of 3 inputs cannot take 28 x 28 images


@pytest.mark.parametrize(
    "label",
    [
        "diagonal",
        "lowrank",
        "tridiagonal",
        "tridiagonal_free",
        "matrix_normal",
        "mixed",
        "regression_learned",
    ],
)
def test_files_of_version_1_load_only_when_unpickling_is_allowed(label, tmp_path):
    """Written by the previous version (tests/data/legacy_v1/make_legacy.py): pickled objects.
    They open only with allow_pickle=True, with the posterior they had; saved again they are
    plain data and give the same posterior."""
    path = LEGACY / f"{label}.pt"
    with pytest.raises(ValueError, match="pickled Python objects.*allow_pickle=True"):
        zoo.load(path)
    reference = torch.load(LEGACY / "reference.pt", weights_only=True)[label]
    old = zoo.load(path, allow_pickle=True)
    again = zoo.load(old.save(tmp_path / "new.pt"))
    for fit in (old, again):
        medians = fit.guide.median()
        for key, value in reference.items():
            name, kind = key.rsplit(":", 1) if ":" in key else (key, None)
            if kind == "median":
                torch.testing.assert_close(medians[name], value)
            elif kind == "variance":
                torch.testing.assert_close(fit.guide.get_posterior(name).variance, value)
        x = torch.randn(40, 3, generator=torch.Generator().manual_seed(0))[:5]
        params = {k: v.unsqueeze(0).expand(3, *v.shape) for k, v in medians.items()}
        outputs = zoo.predict(fit.model, fit.guide, x, params=params, progress=False).outputs
        torch.testing.assert_close(outputs, reference["probs"])


def test_a_pyro_guide_fits_but_a_checkpoint_of_it_is_refused_before_training(tmp_path):
    from pyro.infer.autoguide import AutoNormal

    m = model()
    fit = zoo.fit(m, AutoNormal(m), data(), num_steps=3, **OPTIONS, run=QUIET)
    assert fit.options["guide"] == "AutoNormal" and fit.steps == 3
    steps = []
    with pytest.raises(TypeError, match="cannot be saved as plain data"):
        zoo.fit(
            m,
            AutoNormal(m),
            data(),
            num_steps=3,
            **OPTIONS,
            run=zoo.Run(progress=False, checkpoint=tmp_path / "c.pt", callbacks=[steps.append]),
        )
    assert not steps


@pytest.mark.parametrize("damage", ["truncated", "flipped", "empty"])
def test_a_damaged_fit_file_names_the_path_and_says_it_is_damaged(tmp_path, damage):
    x, y = torch.randn(16, 3), torch.randn(16)
    fit = zoo.fit(
        zoo.models.BayesianMLP(3, (4,), noise=1.0),
        "diagonal",
        (x, y),
        num_steps=2,
        run=zoo.Run(progress=False),
    )
    path = fit.save(tmp_path / "fit.pt")
    data = bytearray(path.read_bytes())
    if damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "flipped":
        for i in range(len(data) // 3, len(data) // 3 + 64):
            data[i] ^= 0xFF
    else:
        data = bytearray()
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="damaged") as err:
        zoo.load(path)
    assert str(path) in str(err.value)


def test_resuming_a_checkpoint_of_another_family_is_refused_with_both_names(tmp_path):
    x, y = torch.randn(16, 3), torch.randn(16)
    ckpt = tmp_path / "ckpt.pt"
    options = dict(num_steps=2, run=zoo.Run(progress=False, checkpoint=ckpt))
    zoo.fit(zoo.models.BayesianMLP(3, (4,), noise=1.0), "diagonal", (x, y), **options)
    with pytest.raises(ValueError, match="'diagonal' family.*'lowrank'"):
        zoo.fit(
            zoo.models.BayesianMLP(3, (4,), noise=1.0),
            "lowrank",
            (x, y),
            run=zoo.Run(resume=ckpt, progress=False),
            num_steps=3,
        )
    resumed = zoo.fit(
        zoo.models.BayesianMLP(3, (4,), noise=1.0),
        "diagonal",
        (x, y),
        run=zoo.Run(resume=ckpt, progress=False),
        num_steps=3,
    )
    assert resumed.steps == 3
