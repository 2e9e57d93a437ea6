"""Save and load, checkpoints, interruption and resumption."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pyro
import pytest
import torch

import zoo
from zoo import persist
from zoo.models import BayesianMLP

FAMILIES = {
    "diagonal": ("diagonal", {}),
    "lowrank": ("lowrank", {"rank": 2}),
    "tridiagonal": ("tridiagonal", {}),
    "tridiagonal_free": ("tridiagonal", {"parameterization": "free"}),
    "matrix_normal": ("matrix_normal", {}),
}


def data(n=64):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 3, generator=g)
    return x, (x[:, 0] > 0).long() + (x[:, 1] > 0).long()


def model():
    return BayesianMLP(3, (8,), 3, task="classification")


OPTIONS = dict(
    batch_size=16,
    lr=0.01,
    lr_schedule=lambda i: 1 / (1 + 0.01 * i),
    num_particles=2,
    progress=False,
    seed=7,
)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_save_load_round_trip_gives_identical_predictions(family, tmp_path):
    name, options = FAMILIES[family]
    fit = zoo.fit(model(), name, data(), num_steps=10, guide_options=options, **OPTIONS)
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
    fit = zoo.fit(model(), "diagonal", data(), num_steps=2, **OPTIONS)
    path = fit.save(tmp_path / "fit.pt")
    other = BayesianMLP(3, (5,), 3, task="classification")
    with pytest.raises(ValueError, match="different model.*fc1.weight: \\(8, 3\\) vs \\(5, 3\\)"):
        zoo.load(path, model=other)
    same_shape = model()
    assert zoo.load(path, model=same_shape).model is same_shape


def test_not_a_zoo_file(tmp_path):
    torch.save({"a": 1}, tmp_path / "x.pt")
    with pytest.raises(ValueError, match="not a bnn-zoo fit file"):
        zoo.load(tmp_path / "x.pt")
    with pytest.raises(FileNotFoundError):
        zoo.load(tmp_path / "missing.pt")


@pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")
def test_atomic_save_gives_the_mode_of_a_plain_open_and_keeps_a_replaced_files_mode(tmp_path):
    with open(tmp_path / "plain", "wb"):
        pass
    persist.atomic_save({"a": 1}, tmp_path / "new.pt")
    assert (tmp_path / "new.pt").stat().st_mode & 0o777 == (
        tmp_path / "plain"
    ).stat().st_mode & 0o777
    os.chmod(tmp_path / "new.pt", 0o640)
    persist.atomic_save({"a": 2}, tmp_path / "new.pt")
    assert (tmp_path / "new.pt").stat().st_mode & 0o777 == 0o640
    assert torch.load(tmp_path / "new.pt")["a"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.pt", "plain"]  # no temporaries


def test_interrupt_then_resume_equals_an_uninterrupted_fit(tmp_path):
    full = zoo.fit(model(), "tridiagonal", data(), num_steps=30, **OPTIONS)

    def ctrl_c(state):
        if state.step == 13:  # mid-epoch: 4 batches per epoch
            raise KeyboardInterrupt

    ckpt = tmp_path / "ckpt.pt"
    part = zoo.fit(
        model(), "tridiagonal", data(), num_steps=30, checkpoint=ckpt, callbacks=[ctrl_c], **OPTIONS
    )
    assert part.interrupted and part.steps == 13
    resumed = zoo.fit(model(), "tridiagonal", data(), num_steps=30, resume=ckpt, **OPTIONS)
    assert resumed.steps == 30
    assert resumed.losses == pytest.approx(full.losses, rel=1e-6)
    for a, b in zip(full.guide.parameters(), resumed.guide.parameters()):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-7)


CHILD = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {tests!r})
    import zoo
    from test_persist import OPTIONS, data, model
    zoo.fit(model(), "diagonal", data(), num_steps=400, checkpoint={ckpt!r}, device="cpu",
            checkpoint_every=3, callbacks=[lambda s: time.sleep(0.005)], **OPTIONS)
    """
)


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
            persist.read(ckpt, "checkpoint")
            reads += 1
        assert child.poll() is None, "the child finished before it could be killed"
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    assert reads > 0
    stopped_at = persist.read(ckpt, "checkpoint")["step"]
    assert 0 < stopped_at < 400
    resumed = zoo.fit(model(), "diagonal", data(), num_steps=400, resume=ckpt, **OPTIONS)
    full = zoo.fit(model(), "diagonal", data(), num_steps=400, **OPTIONS)
    assert resumed.steps == 400
    for a, b in zip(full.guide.parameters(), resumed.guide.parameters()):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-7)
