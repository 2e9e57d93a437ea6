"""Deep ensembles (zoo.baselines.ensembles): members seeded apart, the predictive is the equal
mixture of the members' (checked against the members' own predictions), an ensemble of
identical members is that member, one file saves and loads it, compare gives it a row, and bad
arguments are refused before any fit."""

import math
import multiprocessing
import os
import signal
import sys
import textwrap

import numpy as np
import pytest
import torch

import zoo
from zoo.models.predictions import mixture


def classification(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g)
    return x, (x[:, 0] + 0.5 * x[:, 1] > 0).long()


def classifier():
    return zoo.models.BayesianMLP(3, (8,), 2, task="classification")


def regressor():
    return zoo.models.BayesianMLP(3, (8,), 1, task="regression", noise=0.1)


def test_members_are_fits_seeded_apart():
    """Member ``k`` is ``zoo.fit`` with the seed ``seed + k``, to the bit."""
    data = classification()
    ens = zoo.ensemble(classifier, data, members=3, seed=5, num_steps=20, progress=False)
    assert len(ens.members) == 3 and ens.options == {"members": 3, "family": "map", "seed": 5}
    alone = zoo.fit(classifier(), "map", data, num_steps=20, seed=6, run=zoo.Run(progress=False))
    for a, b in zip(ens.members[1].guide.parameters(), alone.guide.parameters()):
        assert torch.equal(a, b)
    first, second = (next(m.guide.parameters()) for m in ens.members[:2])
    assert not torch.equal(first, second)
    assert ens.steps == 60 and ens.wall_time == pytest.approx(sum(m.wall_time for m in ens.members))


def test_the_predictive_is_the_equal_mixture_of_the_members():
    """Classification: the mixture's probabilities are the mean of each member's predictive
    (``ceil(S / K)`` draws each, member ``k`` seeded ``k``); regression: its mean is the mean
    of the members' means and its epistemic variance includes their spread."""
    x, y = classification()
    ens = zoo.ensemble(
        classifier, (x, y), members=2, family="diagonal", num_steps=20, progress=False
    )
    pred = ens.predict(x, num_samples=6, progress=False)
    assert pred.outputs.shape == (6, 64, 2) and isinstance(pred, zoo.ClassificationPrediction)
    parts = [m.predict(x, num_samples=3, seed=k, progress=False) for k, m in enumerate(ens.members)]
    want = torch.stack([p.probs for p in parts]).mean(0)
    torch.testing.assert_close(pred.probs, want)
    lp = pred.log_likelihood(y)
    torch.testing.assert_close(lp, torch.cat([p.log_likelihood(y) for p in parts]))

    target = x[:, 0] - x[:, 1]
    reg = zoo.ensemble(regressor, (x, target), members=3, num_steps=30, progress=False)
    pred = reg.predict(x, progress=False)
    means = torch.stack([m.predict(x, num_samples=1, progress=False).mean for m in reg.members])
    assert pred.num_samples == 3  # one network per MAP member
    torch.testing.assert_close(pred.mean, means.mean(0))
    torch.testing.assert_close(pred.epistemic_variance, means.var(0, unbiased=False))
    torch.testing.assert_close(pred.variance, means.var(0, unbiased=False) + 0.01)


def test_an_ensemble_of_identical_members_is_that_member():
    x, y = classification()
    fit = zoo.fit(classifier(), "map", (x, y), num_steps=20, run=zoo.Run(progress=False))
    same = zoo.Ensemble([fit, fit, fit])
    torch.testing.assert_close(
        same.predict(x, progress=False).probs, fit.predict(x, num_samples=1, progress=False).probs
    )
    want = fit.evaluate((x, y), progress=False)
    assert same.evaluate((x, y), progress=False) == pytest.approx(want)


def test_mixture_refuses_predictions_of_different_kinds_or_inputs():
    x, _ = classification()
    fit = zoo.fit(classifier(), "map", classification(), num_steps=5, run=zoo.Run(progress=False))
    a = fit.predict(x, num_samples=1, progress=False)
    b = fit.predict(x[:10], num_samples=1, progress=False)
    with pytest.raises(ValueError, match="same inputs"):
        mixture([a, b])
    with pytest.raises(ValueError, match="at least one"):
        mixture([])


def _scratch_left() -> list:
    import tempfile
    from pathlib import Path

    from zoo.baselines.ensemble_processes import SCRATCH_PREFIX

    return list(Path(tempfile.gettempdir()).glob(f"{SCRATCH_PREFIX}{os.getpid()}-*"))


@pytest.mark.slow  # runs child processes: the full tier
def test_members_in_processes_are_the_members_fitted_here():
    """``processes=2``: two forked CPU processes fit the members; each is the fit made in
    this process with its seed, and nothing is left behind (processes, scratch files)."""
    data = classification()
    here = zoo.ensemble(classifier, data, members=3, num_steps=30, progress=False)
    there = zoo.ensemble(classifier, data, members=3, num_steps=30, progress=False, processes=2)
    for a, b in zip(here.members, there.members):
        for p, q in zip(a.guide.parameters(), b.guide.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
        assert a.losses == pytest.approx(b.losses, rel=1e-6) and b.steps == 30
    assert multiprocessing.active_children() == [] and _scratch_left() == []


@pytest.mark.slow  # runs child processes: the full tier
def test_a_member_that_fails_in_its_process_is_named_and_the_others_stop():
    """A member's error comes back with its index and message; a member's process killed
    with SIGKILL is named with its exit code; either way no process and no scratch folder is
    left."""
    builds = multiprocessing.get_context("fork").Value("i", 0)
    parent = os.getpid()

    def failing(kill: bool):
        def factory():
            if os.getpid() != parent:
                with builds.get_lock():
                    builds.value += 1
                    second = builds.value == 2
                if second and kill:
                    os.kill(os.getpid(), signal.SIGKILL)
                if second:
                    raise ValueError("boom in the factory")
            return classifier()

        return factory

    with pytest.raises(RuntimeError, match=r"member [01] failed in its process: ValueError: boom"):
        zoo.ensemble(failing(False), classification(), members=2, num_steps=5, progress=False,
                     processes=2)  # fmt: skip
    assert multiprocessing.active_children() == [] and _scratch_left() == []
    builds.value = 0
    with pytest.raises(RuntimeError, match=r"member [01]'s process ended with exit code -9"):
        zoo.ensemble(failing(True), classification(), members=2, num_steps=200, progress=False,
                     processes=2)  # fmt: skip
    assert multiprocessing.active_children() == [] and _scratch_left() == []


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _children_of(pid: int) -> list[int]:
    from pathlib import Path

    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.slow  # quick tier: under three minutes
@pytest.mark.parametrize("lr,running", [(1e-3, 2), (None, 1)])
def test_a_killed_ensemble_leaves_no_member_running(lr, running):
    """SIGKILL of the process running ``zoo.ensemble(processes=2)`` (no clean-up runs) ends
    its members' processes too: two at once given a rate, or the first member alone while it
    measures the rate the others will be given."""
    import subprocess
    import time

    from tests.conftest import HANG_AFTER, REPO

    script = textwrap.dedent(f"""
        import torch, zoo
        x = torch.randn(256, 3); y = (x[:, 0] > 0).long()
        factory = lambda: zoo.models.BayesianMLP(3, (64,), 2, task="classification")
        zoo.ensemble(factory, (x, y), members=2, num_steps=10**7, progress=False, processes=2,
                     lr={lr})
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO)
    try:
        deadline = time.monotonic() + HANG_AFTER
        while len(members := _children_of(proc.pid)) < running:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        proc.kill()
        proc.wait()
        while any(_running(child) for child in members):
            assert time.monotonic() < deadline, "a member outlived the killed ensemble"
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork")
@pytest.mark.slow  # quick tier: under three minutes
def test_members_run_after_the_caller_used_torchs_thread_pool():
    """A forked child that runs torch's OpenMP pool with several threads after its parent used
    the pool hangs; members run on one thread, so an ensemble in processes finishes after
    the caller's own multithreaded work, on a machine of any size (here it claims 8 cores)."""
    import subprocess

    from tests.conftest import REPO

    script = textwrap.dedent("""
        import os, torch, zoo
        os.sched_getaffinity = lambda pid: set(range(8))  # a larger machine
        torch.set_num_threads(2)
        a = torch.randn(1500, 1500); (a @ a).sum()  # the parent uses the OpenMP pool
        x = torch.randn(512, 256); y = (x[:, 0] > 0).long()  # products large enough to
        factory = lambda: zoo.models.BayesianMLP(256, (512,), 2, task="classification")
        ens = zoo.ensemble(factory, (x, y), members=2, num_steps=3, batch_size=512,
                           progress=False, processes=2)  # run in parallel regions
        print("members", len(ens.members))
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0 and "members 2" in done.stdout, done.stderr[-2000:]


def test_processes_are_checked_before_any_fit():
    from zoo.baselines.ensemble_processes import workers

    for bad in (0, -1, "two", True, 1.5):
        with pytest.raises(ValueError, match="processes must be 'auto' or a positive int"):
            zoo.ensemble(classifier, classification(), members=2, processes=bad)
    data = classification()
    with pytest.raises(ValueError, match="ensemble row 'E'.*processes must be"):
        zoo.compare(classifier, [("E", "ensemble", {"processes": 0})], data, data)
    with pytest.raises(ValueError, match="forked CPU processes.*cuda"):
        workers(2, 4, torch.device("cuda"))
    assert workers("auto", 4, torch.device("cuda")) == 1
    assert workers(8, 3, torch.device("cpu")) == 3


def test_each_member_checkpoints_to_its_own_file_and_a_stopped_ensemble_resumes(tmp_path):
    """``checkpoint=path``: member ``k`` writes ``path.member<k>``; ``resume=path`` resumes the
    members whose files exist and fits the rest, ending with the same ensemble."""
    data = classification()
    path = tmp_path / "ck.pt"
    run = zoo.Run(progress=False, checkpoint=path)
    whole = zoo.ensemble(classifier, data, members=3, num_steps=20, run=run)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"ck.member{k}.pt" for k in range(3)]
    (tmp_path / "ck.member2.pt").unlink()  # as if stopped during member 2
    again = zoo.ensemble(classifier, data, members=3, num_steps=20,
                         run=zoo.Run(progress=False, checkpoint=path, resume=path))  # fmt: skip
    for a, b in zip(whole.members, again.members):
        for p, q in zip(a.guide.parameters(), b.guide.parameters()):
            assert torch.equal(p, q)


def test_to_arviz_has_one_chain_per_member():
    """Member ``k``'s chain is its own ``to_arviz`` with the seed ``seed + k``: the same
    weight draws and log-likelihoods; a MAP ensemble has one draw per chain."""
    pytest.importorskip("arviz")
    x, y = classification()
    ens = zoo.ensemble(classifier, (x, y), members=3, family="diagonal", num_steps=10,
                       progress=False)  # fmt: skip
    idata = ens.to_arviz((x, y), num_samples=12, seed=4, progress=False)
    assert idata.posterior["fc1.weight"].shape == (3, 4, 8, 3)
    assert idata.log_likelihood["obs"].shape == (3, 4, 64)
    for k, member in enumerate(ens.members):
        alone = member.to_arviz((x, y), num_samples=4, seed=4 + k, progress=False)
        assert (
            idata.posterior["fc2.bias"].values[k] == alone.posterior["fc2.bias"].values[0]
        ).all()
        # the mixture's categorical renormalises the members' logits: equal to rounding
        np.testing.assert_allclose(
            idata.log_likelihood["obs"].values[k], alone.log_likelihood["obs"].values[0], atol=1e-6
        )
    assert idata.attrs["inference"] == "deep ensemble of 3 diagonal fits"
    maps = zoo.ensemble(classifier, (x, y), members=2, num_steps=5, progress=False)
    assert maps.to_arviz((x, y), progress=False).posterior["fc1.bias"].shape == (2, 1, 8)


def test_one_file_saves_and_loads_the_ensemble(tmp_path):
    x, y = classification()
    ens = zoo.ensemble(classifier, (x, y), members=2, family="diagonal", num_steps=10,
                       progress=False)  # fmt: skip
    path = ens.save(tmp_path / "ens.pt")
    back = zoo.load(path)
    assert isinstance(back, zoo.Ensemble) and back.options == ens.options
    torch.testing.assert_close(
        back.predict(x, progress=False).probs, ens.predict(x, progress=False).probs
    )
    own = zoo.load(path, model=classifier())  # a model given is copied for every member
    assert own.members[0].model is not own.members[1].model
    raw = path.read_bytes()
    (tmp_path / "cut.pt").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ValueError, match="damaged"):
        zoo.load(tmp_path / "cut.pt")


def test_a_changed_member_is_refused_naming_it(tmp_path):
    x, y = classification()
    ens = zoo.ensemble(classifier, (x, y), members=2, num_steps=5, progress=False)
    payload = {"format": "bnn-zoo", "version": 2, "kind": "ensemble", "options": {}}
    members = [m.payload() for m in ens.members]
    del members[1]["history"]
    torch.save({**payload, "members": members}, tmp_path / "changed.pt")
    with pytest.raises(ValueError, match=r"member 1.*'history'"):
        zoo.load(tmp_path / "changed.pt")
    torch.save({**payload, "members": []}, tmp_path / "empty.pt")
    with pytest.raises(ValueError, match="no members"):
        zoo.load(tmp_path / "empty.pt")


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"members": 0}, ValueError, "members"),
        ({"members": "5"}, TypeError, "members must be an int"),
        ({"members": True}, TypeError, "members must be an int"),
        ({"family": "diagnoal"}, ValueError, "diagnoal"),
        ({"seed": None}, TypeError, "seed must be an int"),
    ],
)
def test_bad_arguments_are_refused_before_any_fit(kwargs, error, match):
    built = []

    def factory():
        built.append(1)
        return classifier()

    with pytest.raises(error, match=match):
        zoo.ensemble(factory, classification(), **{"num_steps": 5, "progress": False, **kwargs})
    assert built == []


def test_a_model_instead_of_a_factory_is_refused():
    with pytest.raises(TypeError, match="model factory"):
        zoo.ensemble(classifier(), classification(), members=2)


def test_a_guide_instance_is_refused_and_a_family_spec_is_taken():
    import guides

    with pytest.raises(TypeError, match="guide of its own"):
        zoo.ensemble(classifier, classification(), family=guides.AutoDiagonal(classifier()))
    spec = guides.family("lowrank", rank=2)
    ens = zoo.ensemble(classifier, classification(), members=2, family=spec, num_steps=5,
                       progress=False)  # fmt: skip
    assert all(m.options["guide"] == "lowrank" for m in ens.members)


def test_the_progress_bar_is_over_members_and_can_be_turned_off(capsys):
    zoo.ensemble(classifier, classification(), members=2, num_steps=5, progress=False)
    assert "ensemble" not in capsys.readouterr().err
    zoo.ensemble(classifier, classification(), members=2, num_steps=5)
    assert "ensemble" in capsys.readouterr().err


def test_compare_has_an_ensemble_row():
    x, y = classification()
    table = zoo.compare(
        classifier,
        ["map", ("3 MAP nets", "ensemble", {"members": 3})],
        (x, y),
        (x, y),
        num_steps=20,
        num_samples=10,
        progress=False,
    )
    row = table.loc["3 MAP nets"]
    assert row["parameters"] == 3 * table.loc["map"]["parameters"]
    assert math.isnan(row["final_elbo"]) and 0 <= row["accuracy"] <= 1
    with pytest.raises(ValueError, match="takes the options"):
        zoo.compare(classifier, [("e", "ensemble", {"membres": 3})], (x, y), (x, y))


def heteroscedastic_data(n=96, seed=0):
    """``y = x_0 + eps``, ``eps`` with a standard deviation that grows with ``|x_0|``."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g)
    return x, x[:, 0] + (0.05 + 0.5 * x[:, 0].abs()) * torch.randn(n, generator=g)


def test_heteroscedastic_members_are_one_argument_away():
    """``noise="heteroscedastic"``: Lakshminarayanan et al.'s members (a mean and a variance
    per input), each the fit of the model built with that likelihood, seed ``seed + k``, to the
    bit; the predicted noise differs across inputs. ``None`` keeps the factory's model."""
    data = heteroscedastic_data()
    ens = zoo.ensemble(regressor, data, members=2, noise="heteroscedastic", num_steps=30,
                       progress=False)  # fmt: skip
    assert ens.options["noise"] == "heteroscedastic"
    assert all(
        isinstance(m.model.likelihood, zoo.models.likelihoods.HeteroscedasticGaussian)
        for m in ens.members
    )

    def built():
        return zoo.models.BayesianMLP(3, (8,), 1, task="regression", noise="heteroscedastic")

    alone = zoo.fit(built(), "map", data, num_steps=30, seed=1, run=zoo.Run(progress=False))
    for a, b in zip(ens.members[1].guide.parameters(), alone.guide.parameters()):
        assert torch.equal(a, b)
    scales = ens.predict(data[0], progress=False).sample_scales
    assert scales.std(-1).min() > 0  # a noise per input, not one level
    plain = zoo.ensemble(regressor, data, members=1, num_steps=5, progress=False)
    assert isinstance(plain.model.likelihood, zoo.models.likelihoods.Gaussian)
    assert "noise" not in plain.options


@pytest.mark.parametrize(
    "factory,noise,match",
    [
        (regressor, "varying", "noise must be None"),
        (regressor, 0.0, "noise must be None"),
        (regressor, True, "noise must be None"),
        (classifier, "heteroscedastic", "needs a zoo.models regression model"),
    ],
)
def test_a_member_noise_that_cannot_apply_is_refused_before_any_fit(factory, noise, match):
    with pytest.raises(ValueError, match=match):
        zoo.ensemble(factory, classification(), noise=noise, num_steps=5, progress=False)
    x, y = classification()
    with pytest.raises(ValueError, match=match):
        zoo.compare(factory, [("e", "ensemble", {"noise": noise})], (x, y), (x, y))


def test_ensemble_members_start_from_their_own_draws():
    from tests.trained import trained_cnn
    from zoo.models import from_module

    net, (x, y), _ = trained_cnn()
    ens = zoo.ensemble(lambda: from_module(net, init="module"),
        (x[:64], y[:64]), members=2, num_steps=1,
                       progress=False)  # fmt: skip
    first, second = (m.guide.median()["5.weight"] for m in ens.members)
    assert not torch.allclose(first, second, atol=1e-2)
    assert not torch.allclose(first, net[5].weight, atol=1e-2)
