"""The HMC reference (zoo.mcmc.sampling, zoo.mcmc.chain, zoo.mcmc.result): exact on a
conjugate model, resumable exactly, refusing what it cannot do, predicting and saving like a
fit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from torch.utils.data import Dataset, TensorDataset

import zoo
from tests.conftest import HANG_AFTER, REPO
from tests.zoo.linear_gaussian import correlated_data, exact_posterior, model_for
from zoo.evaluation.arviz import chain_diagnostics
from zoo.mcmc.chain import read_chain
from zoo.storage import files

pytestmark = pytest.mark.slow  # runs HMC chains

QUICK = {"warmup": 40, "draws": 12, "chunk": 5, "progress": False}


@pytest.fixture(scope="module")
def conjugate():
    """Bayesian linear regression (3 inputs, fixed noise): NUTS against the closed form."""
    x, y = correlated_data(n=200, d=3, corr=0.8)
    ref = zoo.reference(model_for(3), (x, y), chains=4, warmup=300, draws=500, progress=False)
    return x, y, ref


def _weights(draws: dict) -> torch.Tensor:
    """``(..., 4)``: the draws of ``(w_1, w_2, w_3, b)``, the closed form's order."""
    w, b = draws["fc1.weight"], draws["fc1.bias"]
    return torch.cat([w.reshape(*w.shape[:-2], -1), b], -1)


def test_the_conjugate_posterior_is_matched_within_monte_carlo_error(conjugate):
    x, y, ref = conjugate
    mean, precision = exact_posterior(x, y)
    cov = torch.linalg.inv(precision)
    draws = _weights(ref.flat_draws())
    assert ref.shape == (4, 500) and draws.shape == (2000, 4) and ref.divergences == 0
    checks = chain_diagnostics({"weights": _weights(ref.draws), "lp": ref.stats["lp"]})
    ess = checks["weights_ess_bulk"]
    assert ess > 400
    # The mean: within 4 Monte Carlo standard errors (posterior sd / sqrt(ESS)) per coordinate.
    se = cov.diagonal().sqrt() / ess**0.5
    assert ((draws.mean(0) - mean).abs() / se).max() < 4
    # The covariance, normalised by the exact sds: each entry's Monte Carlo error is about
    # sqrt((1 + rho^2) / ESS) <= 0.07 at ESS 400; 0.2 is about three of them.
    sd = cov.diagonal().sqrt()
    error = (torch.cov(draws.T) - cov) / (sd[:, None] * sd[None, :])
    assert error.abs().max() < 0.2
    # R-hat < 1.01 on every weight (identifiable here: no hidden units) and on lp.
    assert checks["weights_r_hat"] < 1.01 and checks["lp_r_hat"] < 1.01
    assert ref.diagnostics(x[:20])["outputs_r_hat"] < 1.01


def test_the_reference_predicts_evaluates_and_saves_like_a_fit(conjugate, tmp_path):
    x, y, ref = conjugate
    pred = ref.predict(x[:7], progress=False)
    assert isinstance(pred, zoo.RegressionPrediction) and pred.sample_means.shape == (2000, 7)
    thin = ref.flat_draws(10)
    assert next(iter(thin.values())).shape[0] == 10
    assert torch.equal(thin["fc1.bias"][0], ref.draws["fc1.bias"][0, 0])
    assert torch.equal(thin["fc1.bias"][-1], ref.draws["fc1.bias"][-1, -1])
    metrics = ref.evaluate((x, y), num_samples=100, progress=False)
    assert set(metrics) == {"rmse", "nll", "coverage_95"} and 0.9 < metrics["coverage_95"] <= 1
    path = ref.save(tmp_path / "ref.pt")
    back = zoo.load(path)
    assert isinstance(back, zoo.Reference) and back.options == ref.options
    for name in ref.draws:
        assert torch.equal(back.draws[name], ref.draws[name])
    assert torch.equal(back.stats["lp"], ref.stats["lp"])
    assert torch.equal(back.predict(x[:7], progress=False).outputs, pred.outputs)
    with pytest.raises(ValueError, match="not a draws, ensemble, fit, laplace or reference file"):
        torch.save({"format": "bnn-zoo", "kind": "checkpoint"}, tmp_path / "c.pt")
        zoo.load(tmp_path / "c.pt")


def test_arviz_has_chains_and_nuts_statistics(conjugate):
    x, y, ref = conjugate
    idata = ref.to_arviz((x[:30], y[:30]), var_names=["fc1.bias"])
    assert dict(idata.posterior.sizes) == {"chain": 4, "draw": 500, "fc1_out": 1}
    stats = idata.sample_stats
    assert set(stats.data_vars) >= {"diverging", "tree_depth", "step_size", "energy", "lp"}
    assert stats["diverging"].dtype == bool and stats["tree_depth"].min() >= 1
    assert idata.log_likelihood["obs"].shape == (4, 500, 30)
    assert idata.posterior_predictive["obs"].shape == (4, 500, 30)
    # lp is the log joint of the unconstrained draw: the model's own log density here (no
    # constrained sites), checked on one draw against a trace.
    draw = {k: v[1, 7] for k, v in ref.draws.items()}
    model = ref.model
    conditioned = zoo.models.base.pyro.poutine.condition(model, data=draw)
    trace = zoo.models.base.pyro.poutine.trace(conditioned).get_trace(x, y)
    assert float(trace.log_prob_sum()) == pytest.approx(float(ref.stats["lp"][1, 7]), rel=1e-9)


def test_resume_and_extension_continue_with_exactly_the_uninterrupted_draws(tmp_path):
    x, y = correlated_data(n=60, d=2, corr=0.5)
    whole = zoo.reference(
        model_for(2), (x, y), chains=2, checkpoint=tmp_path / "a", processes=1, **QUICK
    )
    short = dict(QUICK, draws=5)
    zoo.reference(model_for(2), (x, y), chains=2, checkpoint=tmp_path / "b", **short)
    assert len(read_chain(tmp_path / "b" / "chain1.pt")["stats"]["lp"]) == 5
    # Two processes (the first run had one): the same per-chain seeds, the same draws.
    resumed = zoo.reference(model_for(2), (x, y), chains=2, checkpoint=tmp_path / "b", **QUICK)
    for name in whole.draws:
        assert torch.equal(whole.draws[name], resumed.draws[name])
    assert torch.equal(whole.stats["lp"], resumed.stats["lp"])
    assert whole.options["processes"] == 1 and resumed.options["processes"] == 2
    with pytest.raises(ValueError, match="other settings .*seed=0 now 1"):
        zoo.reference(model_for(2), (x, y), chains=2, seed=1, checkpoint=tmp_path / "b", **QUICK)
    with pytest.raises(ValueError, match="other data"):
        zoo.reference(model_for(2), (x, y + 1), chains=2, checkpoint=tmp_path / "b", **QUICK)
    # permuted labels and swapped inputs keep the size and the sums: the SHA-256 sees them
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="other data"):
        zoo.reference(model_for(2), (x, y[order]), chains=2, checkpoint=tmp_path / "b", **QUICK)
    with pytest.raises(ValueError, match="other data"):
        zoo.reference(model_for(2), (x.flip(1), y), chains=2, checkpoint=tmp_path / "b", **QUICK)


@pytest.mark.parametrize(
    "change, phrase",
    [
        (lambda s: s["inverse_mass_matrix"][0].__setitem__(1, torch.ones(2)), "inverse mass"),
        (lambda s: s["z"].__setitem__(next(iter(s["z"])), torch.zeros(7)), "position of"),
        (lambda s: s["draws"][next(iter(s["draws"]))].__setitem__(0, torch.zeros(9)), "draws of"),
        (lambda s: s["rng"].__setitem__("torch", torch.zeros(3, dtype=torch.uint8)), "generator"),
    ],
    ids=["mass-matrix", "position", "draws", "rng"],
)
def test_a_changed_chain_file_is_refused_naming_the_entry(tmp_path, change, phrase):
    """Entries of the model's sites and shapes, checked before a chain resumes (raw index and
    shape errors from deep inside Pyro before)."""
    x, y = correlated_data(n=40, d=2, corr=0.5)
    short = dict(QUICK, draws=3)
    zoo.reference(model_for(2), (x, y), chains=1, checkpoint=tmp_path, **short)
    path = tmp_path / "chain0.pt"
    state = torch.load(path, weights_only=True)
    change(state)
    files.atomic_save(state, path)  # the checksum recomputed: the checks see the contents
    with pytest.raises(ValueError, match=phrase):
        zoo.reference(model_for(2), (x, y), chains=1, checkpoint=tmp_path, **QUICK)


def test_the_callers_random_state_and_threads_are_left_as_they_were():
    x, y = correlated_data(n=40, d=2)
    model = model_for(2)  # built first: a network's initialisation draws from torch's generator
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    threads = torch.get_num_threads()
    a = zoo.reference(model, (x, y), chains=1, processes=1, **QUICK)
    assert torch.equal(torch.rand(3), expected) and torch.get_num_threads() == threads
    b = zoo.reference(model, (x, y), chains=1, processes=1, **QUICK)
    assert torch.equal(a.draws["fc1.weight"], b.draws["fc1.weight"])  # the seed decides


def test_what_full_batch_hmc_cannot_do_is_refused_before_sampling():
    x, y = torch.randn(50, 40), torch.randn(50)
    big = zoo.models.BayesianMLP(40, (200,))
    small = zoo.ReferenceBudget(parameters=1000)
    with pytest.raises(zoo.ReferenceTooLargeError, match="8,402 latent scalars.*parameters="):
        zoo.reference(big, (x, y), budget=small, progress=False)
    with pytest.raises(zoo.ReferenceTooLargeError, match="FLOPs.*gradient_flops="):
        zoo.reference(big, (x, y), budget=zoo.ReferenceBudget(gradient_flops=1e5), progress=False)

    class Huge(Dataset):  # a data set read item by item: refused from its length, unread
        def __len__(self):
            return 10**9

        def __getitem__(self, i):
            if i > 0:
                raise AssertionError("the data set was read")
            return torch.zeros(40), torch.zeros(())

    with pytest.raises(zoo.ReferenceTooLargeError, match="MiB.*data_bytes="):
        zoo.reference(big, Huge(), progress=False)
    with pytest.raises(ValueError, match="draws must be a positive integer, got 0"):
        zoo.reference(big, TensorDataset(x, y), draws=0, progress=False)


@pytest.mark.parametrize(
    "options, phrase",
    [
        (dict(sampler=zoo.NUTS(max_tree_depth=0)), "max_tree_depth must be a positive integer"),
        (dict(draws=2.5), "draws must be a positive integer, got 2.5"),
        (dict(warmup=-1), "warmup must be an int >= 0"),
        (dict(chains=0), "chains must be a positive integer"),
        (dict(sampler=zoo.NUTS(target_accept=1.5)), "target_accept must be a number strictly"),
        (dict(sampler=zoo.NUTS(target_accept=0)), "target_accept must be a number strictly"),
        (dict(sampler=zoo.NUTS(jit="yes")), "jit must be True or False"),
        (dict(seed=-3), "seed must be None"),
    ],
)
def test_settings_no_run_can_use_are_refused_before_any_work(options, phrase, monkeypatch):
    """The reference's settings and its sampler's, refused before the data are read."""

    def no_data(*args):
        raise AssertionError("the data were read")

    monkeypatch.setattr(zoo.mcmc.sampling, "_in_memory", no_data)
    with pytest.raises(ValueError, match=phrase):
        zoo.reference(zoo.models.BayesianMLP(3, (4,)), (torch.randn(9, 3), torch.randn(9)),
                      progress=False, **options)  # fmt: skip


def test_nuts_settings_passed_as_keywords_say_where_they_go_now():
    """target_accept=, max_tree_depth= and jit= moved into the sampler object (0.3.0)."""
    data = (torch.randn(9, 3), torch.randn(9))
    with pytest.raises(TypeError, match=r"target_accept= goes in sampler=zoo.NUTS\(target_acc"):
        zoo.reference(zoo.models.BayesianMLP(3, (4,)), data, target_accept=0.9)
    for bad in (zoo.NUTS, "nuts", None):
        with pytest.raises(TypeError, match="sampler must be"):
            zoo.reference(zoo.models.BayesianMLP(3, (4,)), data, sampler=bad, progress=False)


def test_a_second_sampler_is_one_class(tmp_path):
    """The seam: Pyro's fixed-length HMC written as one Sampler subclass runs through
    zoo.reference (chains, checkpoints and exact resume included) with no other change."""
    import dataclasses

    from pyro.infer.mcmc import HMC

    from zoo.mcmc import samplers

    @dataclasses.dataclass(frozen=True)
    class FixedHMC(samplers.Sampler):
        num_steps: int = 4
        name = "fixed-hmc"
        stat_names = ("step_size", "lp")

        def check(self):
            if self.num_steps < 1:
                raise ValueError("num_steps must be at least 1")

        def kernel(self, model, adapted=None):
            step, steps = (0.05, self.num_steps) if adapted is None else adapted["trajectory"]
            return HMC(model, step_size=step, num_steps=steps,
                       adapt_step_size=adapted is None, adapt_mass_matrix=False)  # fmt: skip

        def adapted(self, kernel):  # the adapted step size, and the steps Pyro derived from it
            return {"trajectory": [float(kernel.step_size), kernel.num_steps]}

        def restore(self, kernel, adapted):
            pass

        @classmethod
        def check_adapted(cls, state, path):
            assert state["trajectory"][0] > 0

        def transition(self, kernel, z):
            z = kernel.sample(z)
            lp = -float(kernel.potential_fn(z))
            return z, {"step_size": float(kernel.step_size), "lp": lp}

    monkey = dict(samplers.SAMPLERS)
    samplers.SAMPLERS["fixed-hmc"] = FixedHMC
    try:
        x = torch.randn(20, 2)
        y = x[:, 0] + 0.1 * torch.randn(20)
        make = lambda: zoo.models.BayesianMLP(2, (3,), noise=0.5)  # noqa: E731
        options = dict(chains=2, warmup=5, draws=8, chunk=4, processes=1, progress=False)
        whole = zoo.reference(make(), (x, y), sampler=FixedHMC(), seed=3, **options)
        assert whole.options["sampler"] == "fixed-hmc" and set(whole.stats) == {"step_size", "lp"}
        first = zoo.reference(make(), (x, y), sampler=FixedHMC(), seed=3, checkpoint=tmp_path,
                              **{**options, "draws": 4})  # fmt: skip
        resumed = zoo.reference(make(), (x, y), sampler=FixedHMC(), seed=3, checkpoint=tmp_path,
                                **options)  # fmt: skip
        assert len(first.stats["lp"][0]) == 4
        for name in whole.draws:
            assert torch.equal(whole.draws[name], resumed.draws[name])
        with pytest.raises(ValueError, match="other settings.*num_steps"):
            zoo.reference(make(), (x, y), sampler=FixedHMC(num_steps=5), seed=3,
                          checkpoint=tmp_path, **options)  # fmt: skip
    finally:
        samplers.SAMPLERS.clear()
        samplers.SAMPLERS.update(monkey)


def test_the_nuts_statistics_read_what_pyro_has():
    """NUTS's per-draw statistics come from the transition's own sample sites and from the
    state Pyro keeps privately (read in one place, zoo.mcmc.samplers._pyro_state). Checked
    against an independent recorder that hooks Pyro's tree building itself: the same tree
    depths and start energies, bitwise, on the same seed. Fails when Pyro renames what is read."""
    from pyro.infer.mcmc import NUTS

    from zoo.mcmc.samplers import _pyro_state

    class Hooked(NUTS):  # the test's own view of the energy and depth, from Pyro's internals
        def _sample_r(self, name):
            r, r_unscaled = super()._sample_r(name)
            self.energies.append(
                float(self._kinetic_energy(r_unscaled) + self._potential_energy_last)
            )
            self.depths.append(0)
            return r, r_unscaled

        def _build_tree(self, z, r, z_grads, log_slice, direction, tree_depth, energy_current):
            self.depths[-1] = max(self.depths[-1], tree_depth + 1)
            return super()._build_tree(
                z, r, z_grads, log_slice, direction, tree_depth, energy_current
            )

    x = torch.randn(10, 2, generator=torch.Generator().manual_seed(0))
    model = zoo.models.BayesianMLP(2, (2,), noise=1.0)
    sampler = zoo.NUTS(jit=False)
    results = []
    for hooked in (False, True):
        torch.manual_seed(1)
        kernel = sampler.kernel(model)
        if hooked:
            kernel.__class__, kernel.energies, kernel.depths = Hooked, [], []
        kernel.setup(3, x, x[:, 0])
        z = {k: v.detach() for k, v in kernel.initial_params.items()}
        for _ in range(3):
            z = kernel.sample(z)
        stats = [sampler.transition(kernel, z)[1] for _ in range(4)]
        results.append((kernel, stats))
    (_, ours), (hooked, _) = results
    assert [s["tree_depth"] for s in ours] == [float(d) for d in hooked.depths[-4:]]
    assert [s["energy"] for s in ours] == hooked.energies[-4:]  # setup draws a momentum too
    assert set(_pyro_state(hooked)) == {"potential", "divergences", "mean_accept", "post_warmup"}
    assert _pyro_state(hooked)["post_warmup"] == 4


def test_a_checkpoint_that_is_a_file_is_refused(tmp_path):
    path = tmp_path / "chains.pt"
    path.write_bytes(b"x")
    with pytest.raises(ValueError, match="is a file: a reference's checkpoint is a folder"):
        zoo.reference(zoo.models.BayesianMLP(3, (4,)), (torch.randn(9, 3), torch.randn(9)),
                      checkpoint=path, progress=False)  # fmt: skip


def test_bad_data_is_refused_before_sampling_and_a_failing_chain_is_reported():
    x, y = correlated_data(n=40, d=2)
    bad = y.clone()
    bad[3] = float("nan")
    with pytest.raises(ValueError, match="3"):
        zoo.reference(model_for(2), (x, bad), chains=2, progress=False)

    class Failing(type(model_for(2))):
        def network(self, x, params):
            if x.shape[0] > 2:  # the checks pass; the chains' full-batch potential fails
                raise RuntimeError("the network failed on purpose")
            return super().network(x, params)

    model = Failing(2, (), 1, noise=1.0).double()
    with pytest.raises(RuntimeError, match="chain 0's process ended with exit code 1"):
        zoo.reference(
            model,
            (x, y),
            chains=2,
            progress=False,
            **{k: QUICK[k] for k in QUICK if k != "progress"},
        )


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads /proc")
def test_chains_end_when_a_killed_reference_leaves_them(tmp_path):
    """SIGKILL of the process running zoo.reference: its forked chains must stop too (they
    went on sampling into the checkpoint folder), and a scratch folder is not left running."""
    folder = tmp_path / "chains"
    script = textwrap.dedent(f"""
        import sys, torch
        sys.path.insert(0, {str(REPO)!r})
        import zoo
        x = torch.randn(30, 2); y = x[:, 0]
        zoo.reference(zoo.models.BayesianMLP(2, (3,), noise=1.0), (x, y), chains=2,
                      processes=2, warmup=5, draws=10**6, chunk=5, sampler=zoo.NUTS(jit=False),
                      checkpoint={str(folder)!r}, progress=False)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + HANG_AFTER
        while not (folder / "chain1.pt").exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        chains = _children_of(proc.pid)
        assert len(chains) == 2
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        while any(_running(pid) for pid in chains):
            assert time.monotonic() < deadline, "a chain outlived zoo.reference"
            time.sleep(0.1)
        written = {p: p.stat().st_mtime_ns for p in folder.iterdir()}
        time.sleep(1.0)
        assert {p: p.stat().st_mtime_ns for p in folder.iterdir()} == written
    finally:
        if proc.poll() is None:
            proc.kill()


def _children_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry))
    return found


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
