"""Fits across processes (zoo.runtime.distributed): two CPU ranks on gloo, started by Lightning as
it starts a user's script (tests/zoo/distributed_runs.py), and the sharding pieces in-process."""

from __future__ import annotations

import math
import os
import shutil
import signal
import time

import pytest
import torch
from torch.utils.data import IterableDataset, TensorDataset

import zoo
from tests.conftest import HANG_AFTER
from tests.zoo.distributed_runs import launch, results
from tests.zoo.linear_gaussian import (
    MEAN_FIELD_FIT,
    MEAN_FIELD_GUIDE,
    correlated_data,
    exact_elbo,
    exact_posterior,
    guide_gaussian,
    model_for,
)
from zoo.data.batches import Batches
from zoo.runtime.distributed import Ranks, requested
from zoo.training.checkpoint import read_checkpoint
from zoo.training.options import grouped

pytestmark = pytest.mark.slow  # starts distributed runs in child processes

pytest.importorskip("lightning")


def test_two_ranks_reach_the_exact_mean_field_optimum_and_predict_as_one(tmp_path):
    """Per-rank batch 50 on 2 ranks: the N / B_local scaling with averaged gradients reaches the
    exact mean-field optimum, as a 1-process fit with batch 100 does (the same ELBO within Monte
    Carlo noise); both ranks hold the same guide; sharded predictions equal one process's."""
    rc, output = launch("conjugate", tmp_path, 1500)
    assert rc == 0, output[-3000:]
    r0, r1 = results(tmp_path, "conjugate")
    assert r0["world_size"] == 2 and r0["steps"] == 1500
    assert torch.equal(r0["mean"], r1["mean"]) and torch.equal(r0["cov"], r1["cov"])
    x, y = correlated_data(n=1000, d=3, corr=0.8)
    mean, precision = exact_posterior(x, y)
    mf_var = 1 / precision.diagonal()
    assert ((r0["mean"] - mean).abs() / mf_var.sqrt()).max() < 0.15
    assert ((r0["cov"].diagonal() / mf_var) - 1).abs().max() < 0.15
    one = zoo.fit(
        model_for(3),
        MEAN_FIELD_GUIDE,
        (x, y),
        num_steps=1500,
        batch_size=100,
        **grouped({**MEAN_FIELD_FIT, "progress": False}),
    )
    optimum = exact_elbo(x, y, mean, torch.diag(mf_var))
    two_ranks = exact_elbo(x, y, r0["mean"], r0["cov"])
    one_process = exact_elbo(x, y, *guide_gaussian(one.guide))
    assert optimum - 0.2 < two_ranks <= optimum and optimum - 0.2 < one_process <= optimum
    for r in (r0, r1):  # sharded (101 rows: shards of 51 and 50) == one process, on every rank
        assert r["evaluate"]["sharded"] == r["evaluate"]["one"] == r0["evaluate"]["one"]
        assert torch.equal(r["predict"]["sharded"], r["predict"]["one"])
        assert r["predict"]["sharded"].shape == (8, 101)
        assert torch.equal(r["loglik"]["sharded"], r0["loglik"]["one"])


def test_ranks_skip_a_divergent_step_together_and_a_failing_rank_is_named(tmp_path):
    """A NaN on rank 1 at step 3 (on_divergence="skip"): both ranks skip it and stay identical;
    rank 1 raising at step 6 stops rank 0 with an error naming rank 1, within bounded time."""
    start = time.perf_counter()
    rc, output = launch("failing", tmp_path, 50)
    assert rc != 0 and time.perf_counter() - start < 120
    assert "RankFailedError: rank 1 of 2 failed at step 6" in output  # rank 0's error
    assert "RuntimeError: rank 1's network failed on purpose" in output  # rank 1's own
    t0, t1 = (torch.load(tmp_path / f"trace-rank{r}.pt") for r in range(2))
    assert [s for s, _, _ in t0] == [s for s, _, _ in t1] == [1, 2, 3, 4, 5, 6]
    assert t0 == t1  # the same skips and the same parameters after every step
    assert t0[2][1] == [] and t0[3][1] == [3]


def test_a_killed_rank_ends_the_run_and_resume_continues_it_exactly(tmp_path, mnist_root):
    """SIGKILL one rank mid-fit: rank 0 stops with a clear error within seconds, the last
    checkpoint loads, and resuming on as many ranks ends where an uninterrupted fit ends."""
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    rc, output = launch("lenet", whole, 40, data=mnist_root)
    assert rc == 0, output[-3000:]
    proc = launch("lenet", broken, 100_000, wait=False, data=mnist_root)
    deadline = time.monotonic() + HANG_AFTER
    while not ((broken / "fit.ckpt").exists() and (broken / "pid1").exists()):
        assert time.monotonic() < deadline and proc.poll() is None, "no checkpoint written"
        time.sleep(0.2)
    os.kill(int((broken / "pid1").read_text()), signal.SIGKILL)
    killed = time.monotonic()
    output, _ = proc.communicate(timeout=HANG_AFTER)
    assert proc.returncode != 0 and time.monotonic() - killed < HANG_AFTER
    assert "RankFailedError: rank 0 of 2: a collective at step" in output
    assert "so rank 1 stopped" in output
    step = read_checkpoint(broken / "fit.ckpt")["state"]["step"]
    assert 5 <= step < 40 and step % 5 == 0
    shutil.copy(broken / "fit.ckpt", tmp_path / "two-ranks.ckpt")
    rc, output = launch("lenet-resume", broken, 40, data=mnist_root)
    assert rc == 0, output[-3000:]
    (a, _), (b, b1) = results(whole, "lenet"), results(broken, "lenet-resume")
    assert a["steps"] == b["steps"] == 40
    assert torch.equal(a["losses"], b["losses"])
    for name, value in a["params"].items():
        assert torch.equal(value, b["params"][name]) and torch.equal(value, b1["params"][name])
    # One process resumes the two ranks' checkpoint too: the same optimiser state and history
    # up to the checkpoint, then its own draws (not the same numbers as two ranks).
    one = zoo.fit(
        zoo.models.LeNet5(hidden=20),
        "diagonal",
        zoo.data.mnist(mnist_root, limit=512),
        num_steps=step + 2,
        batch_size=16,
        lr=1e-3,  # the ranks' constant rate
        run=zoo.Run(resume=tmp_path / "two-ranks.ckpt", progress=False),
    )
    assert one.steps == step + 2 and one.options["world_size"] == 1
    assert torch.equal(torch.tensor(one.losses[:step]), a["losses"][:step])


def test_forked_ranks_hand_the_fit_back_to_the_calling_process(tmp_path):
    rc, output = launch("forked", tmp_path, 12)
    assert rc == 0, output[-3000:]
    got = torch.load(tmp_path / "forked-rank0.pt")
    assert got["type"] == "FitResult" and got["steps"] == 12 and got["world_size"] == 2
    assert set(got["metrics"]) == {"rmse", "nll", "coverage_95"}
    assert got["threads"] == 2


# ---- the pieces, in this process -----------------------------------------------------------


def _fake_ranks(rank: int, world_size: int) -> Ranks:
    ranks = Ranks()
    ranks.rank, ranks.world_size = rank, world_size
    return ranks


@pytest.mark.parametrize("n, world_size, batch", [(10, 2, 3), (11, 3, 2), (7, 2, 7)])
def test_tensor_shards_split_every_epoch_shuffle_into_equal_parts(n, world_size, batch):
    x, y = torch.arange(n, dtype=torch.float32)[:, None], torch.arange(n)
    seen, steps = [], set()
    for rank in range(world_size):
        generator = torch.Generator().manual_seed(4)
        batches = Batches((x, y), batch, torch.device("cpu"), generator, shard=(rank, world_size))
        got = [yb for _, yb in batches.epoch()]
        assert len(batches) == n  # the ELBO's N stays the full data size
        steps.add((len(got), batches.steps_per_epoch))
        seen.append(torch.cat(got))
    assert len(steps) == 1 and steps.pop()[0] == steps_expected(n, world_size, batch)
    everything = torch.cat(seen)
    assert len(everything) == -(-n // world_size) * world_size  # padded by wrapping round
    assert set(everything.tolist()) == set(range(n))


def steps_expected(n: int, world_size: int, batch: int) -> int:
    return math.ceil(math.ceil(n / world_size) / batch)


def test_a_dataset_is_sharded_by_a_distributed_sampler_reshuffled_per_epoch():
    data = TensorDataset(torch.randn(9, 2), torch.arange(9))
    epochs = {}
    for rank in range(2):
        generator = torch.Generator().manual_seed(0)
        batches = Batches(data, 2, torch.device("cpu"), generator, shard=(rank, 2), seed=3)
        batches.tensors = None  # as a Dataset that is not in memory
        batches.loader = torch.utils.data.DataLoader(data, batch_size=2)
        batches._shard_loader(3)
        epochs[rank] = [torch.cat([yb for _, yb in batches.epoch(e)]) for e in (0, 1)]
    for e in (0, 1):
        both = torch.cat([epochs[0][e], epochs[1][e]])
        assert len(both) == 10 and set(both.tolist()) == set(range(9))
    assert not torch.equal(epochs[0][0], epochs[0][1])  # a new shuffle each epoch


def test_an_iterable_dataset_cannot_be_sharded():
    class Stream(IterableDataset):
        def __len__(self):
            return 1

        def __iter__(self):
            yield torch.zeros(2), torch.tensor(0)

    loader = torch.utils.data.DataLoader(Stream(), batch_size=1)
    with pytest.raises(ValueError, match="IterableDataset cannot be split across processes"):
        Batches(loader, 1, torch.device("cpu"), torch.Generator(), shard=(0, 2))


def test_single_process_ranks_change_nothing():
    ranks = Ranks()
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.full((3,), 2.0)
    loss = torch.tensor(5.0)
    assert ranks.average_step(loss, [p], 0) is loss and torch.equal(p.grad, torch.full((3,), 2.0))
    assert ranks.seed(7) == 7 and ranks.mean(1.5) == 1.5 and ranks.gather("a") == ["a"]
    assert ranks.shard_bounds(5) == (0, 5)
    seeds = {_fake_ranks(r, 4).seed(7) for r in range(4)}
    assert len(seeds) == 4  # each rank its own weight draws
    assert [_fake_ranks(r, 3).shard_bounds(7) for r in range(3)] == [(0, 3), (3, 6), (6, 7)]


def test_distributed_arguments_are_checked_before_anything_starts():
    assert not requested(1, 1, "auto") and requested(2, 1, "auto") and requested(1, 1, "ddp")
    x, y = correlated_data(n=20, d=3)
    with pytest.raises(ValueError, match="disagree"):
        zoo.fit(
            model_for(3),
            "diagonal",
            (x, y),
            engine=zoo.Engine(devices=2, accelerator="gpu"),
            run=zoo.Run(progress=False),
        )
    with pytest.raises(ValueError, match="disagree"):
        zoo.fit(
            model_for(3),
            "diagonal",
            (x, y),
            engine=zoo.Engine(devices=2, device="cuda:1"),
            run=zoo.Run(progress=False),
        )
    with pytest.raises(ValueError, match="lr must be a positive number"):  # no process started
        zoo.fit(
            model_for(3),
            "diagonal",
            (x, y),
            engine=zoo.Engine(devices=2),
            run=zoo.Run(progress=False),
            lr=-1.0,
        )
    with pytest.raises(ValueError, match="optimizer must be one of"):
        zoo.fit(
            model_for(3),
            "diagonal",
            (x, y),
            engine=zoo.Engine(devices=2),
            optim=zoo.Optim(optimizer="lbfgs"),
            run=zoo.Run(progress=False),
        )
    with pytest.raises(ValueError, match="data parallel"):
        zoo.fit(
            model_for(3),
            "diagonal",
            (x, y),
            engine=zoo.Engine(strategy="fsdp"),
            run=zoo.Run(progress=False),
        )
    for options in ({"check_every": 10}, {"cuda_graph": True}):
        with pytest.raises(ValueError, match="applies to fits in one process"):
            zoo.fit(
                model_for(3),
                "diagonal",
                (x, y),
                **grouped(
                    {**options, "engine": zoo.Engine(devices=2), "run": zoo.Run(progress=False)}
                ),
            )
    fit = zoo.fit(
        model_for(3),
        "diagonal",
        (x, y),
        num_steps=2,
        run=zoo.Run(progress=False),
    )
    assert fit.options["world_size"] == 1
    with pytest.raises(RuntimeError, match="no process group here"):
        fit.predict(x, num_samples=2, distributed=True)


def test_a_rank_that_exits_is_reported_as_rank_failed(monkeypatch):
    """A ddp_spawn rank killed by a signal surfaces from torch's joiner as
    ProcessExitedException; the fit raises the documented RankFailedError, naming the rank."""
    from zoo.runtime import distributed

    class Fabric:
        def __init__(self, **kwargs):
            pass

        def launch(self, function):
            raise torch.multiprocessing.ProcessExitedException(
                "process 1 terminated with signal SIGKILL", error_index=1, error_pid=4242,
                exit_code=-9, signal_name="SIGKILL",
            )  # fmt: skip

    monkeypatch.setattr(distributed, "fabric_class", lambda: Fabric)
    with pytest.raises(distributed.RankFailedError, match="rank 1 \\(process 4242\\).*SIGKILL"):
        distributed.launch(lambda ranks: None, accelerator="cpu", devices=2, num_nodes=1,
                           strategy="ddp_spawn")  # fmt: skip


def test_ranks_share_batch_norm_statistics_and_resume_them_exactly(tmp_path):
    """Two ranks of a ResNet fit end with one model: the same guide and the same running
    statistics (the ranks' mean every step); a fit resumed from its step-4 checkpoint on two
    ranks ends where the uninterrupted one did."""
    full, part = tmp_path / "full", tmp_path / "part"
    rc, output = launch("resnet", full, 6)
    assert rc == 0, output[-3000:]
    r0, r1 = results(full, "resnet")
    assert r0["steps"] == 6
    for key in r0["params"]:
        assert torch.equal(r0["params"][key], r1["params"][key]), key
    stats = [k for k in r0["buffers"] if "running" in k]
    assert stats and all(torch.equal(r0["buffers"][k], r1["buffers"][k]) for k in stats)
    rc, output = launch("resnet", part, 4)
    assert rc == 0, output[-3000:]
    rc, output = launch("resnet-resume", part, 6)
    assert rc == 0, output[-3000:]
    resumed = torch.load(part / "resnet-resume-rank0.pt")
    assert resumed["steps"] == 6
    assert torch.allclose(resumed["losses"], r0["losses"], rtol=1e-5)
    for key in stats:
        assert torch.allclose(resumed["buffers"][key], r0["buffers"][key], atol=1e-6), key


def test_two_ranks_measure_one_rate_and_stay_one_fit(tmp_path):
    """A default fit on two ranks runs the rate test on the ranks' mean gradients and losses:
    both record the same sweep and choose the same rate, and the fit stays identical."""
    rc, output = launch("measured", tmp_path, 80)
    assert rc == 0, output[-3000:]
    r0, r1 = results(tmp_path, "measured")
    assert r0["lr_test"] == r1["lr_test"] and r0["lr"] == r1["lr"] == r0["lr_test"]["lr"]
    assert r0["steps"] + r0["lr_test"]["steps"] == 80
    for name, value in r0["params"].items():
        assert torch.equal(value, r1["params"][name]), name
