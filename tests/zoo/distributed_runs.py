"""Distributed fits for tests/zoo/runtime/test_distributed.py, one scenario per run:

    python -m tests.zoo.distributed_runs SCENARIO OUT [STEPS]

Run from the repository root. ``zoo.fit(devices=2, strategy="ddp")`` makes Lightning start a
second process running this same command, as it would for a user's script; each rank writes
what the test reads into ``OUT/rank<r>.pt`` (plain tensors and numbers).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

import zoo
from tests.conftest import HANG_AFTER
from tests.zoo.linear_gaussian import (
    MEAN_FIELD_FIT,
    MEAN_FIELD_GUIDE,
    correlated_data,
    guide_gaussian,
    model_for,
)
from zoo.models import BayesianMLP
from zoo.priors import NormalPrior
from zoo.training.options import grouped

REPO = Path(__file__).resolve().parents[2]
RANK = int(os.environ.get("LOCAL_RANK", 0))  # set by Lightning in the processes it starts
DIST = {"accelerator": "cpu", "devices": 2, "strategy": "ddp", "progress": False}


def launch(scenario: str, out, steps: int, wait: bool = True, data=None):
    """``python -m tests.zoo.distributed_runs`` (rank 0; Lightning starts rank 1); ``data``:
    the MNIST root for the scenarios that read MNIST."""
    cmd = [sys.executable, "-m", "tests.zoo.distributed_runs", scenario, str(out), str(steps)]
    env = {**os.environ, **({"ZOO_DATA": str(data)} if data is not None else {})}
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    if not wait:
        return proc
    output, _ = proc.communicate(timeout=HANG_AFTER)
    return proc.returncode, output


def results(out, scenario: str) -> list[dict]:
    return [torch.load(out / f"{scenario}-rank{r}.pt") for r in range(2)]


def conjugate(out: Path, steps: int) -> dict:
    """The linear-Gaussian problem with per-rank batch 50; distributed predictions too."""
    x, y = correlated_data(n=1000, d=3, corr=0.8)
    fit = zoo.fit(
        model_for(3),
        MEAN_FIELD_GUIDE,
        (x, y),
        num_steps=steps,
        batch_size=50,
        **grouped({**MEAN_FIELD_FIT, **DIST}),
    )
    mean, cov = guide_gaussian(fit.guide)
    xt, yt = correlated_data(n=101, d=3, seed=1)  # 101 rows: the ranks' shards differ in size
    evaluated = {
        split: fit.evaluate((xt, yt), num_samples=16, seed=3, distributed=split == "sharded")
        for split in ("sharded", "one")
    }
    preds = {
        split: fit.predict(xt, num_samples=8, seed=5, distributed=split == "sharded").sample_means
        for split in ("sharded", "one")
    }
    idata = {
        split: fit.to_arviz((xt, yt), num_samples=8, seed=7, distributed=split == "sharded")
        for split in ("sharded", "one")
    }
    loglik = {k: torch.as_tensor(v.log_likelihood["obs"].values) for k, v in idata.items()}
    return {
        "mean": mean,
        "cov": cov,
        "loss": fit.losses[-1],
        "steps": fit.steps,
        "world_size": fit.options["world_size"],
        "evaluate": evaluated,
        "predict": preds,
        "loglik": loglik,
    }


class FailingMLP(BayesianMLP):
    """Rank 1's network gives NaN at step 3 and raises from step 6 (the step is set by the
    fit's callback)."""

    step = 0

    def network(self, x, params):
        out = super().network(x, params)
        if RANK == 1 and FailingMLP.step == 3:
            return out * float("nan")
        if RANK == 1 and FailingMLP.step >= 6:
            raise RuntimeError("rank 1's network failed on purpose")
        return out


def failing(out: Path, steps: int) -> dict:
    """on_divergence="skip" with a NaN on one rank, then an exception on that rank; each rank
    records after every step what it skipped and a checksum of its guide."""
    x, y = correlated_data(n=200, d=3)
    model = FailingMLP(3, (), 1, prior=NormalPrior(1.0), noise=1.0).double()
    trace = []

    def record(state):
        FailingMLP.step = state.step
        checksum = sum(float(p.sum()) for p in state.result.guide.parameters())
        trace.append((state.step, list(state.result.skipped_steps), checksum))
        torch.save(trace, out / f"trace-rank{RANK}.pt")

    fit = zoo.fit(
        model,
        "diagonal",
        (x, y),
        num_steps=steps,
        batch_size=20,
        **grouped({**DIST, "jit": False, "on_divergence": "skip", "callbacks": [record]}),
    )
    return {"steps": fit.steps}


def lenet(out: Path, steps: int, resume: bool = False) -> dict:
    """LeNet-5 on 512 MNIST images with a checkpoint every 5 steps (killed, resumed, or not), at
    a constant rate: a run planned for another length and resumed to this one then takes the
    same steps (the default rate decays over the planned length)."""
    (out / f"pid{RANK}").write_text(str(os.getpid()))
    train = zoo.data.mnist(None, limit=512)
    checkpoint = out / "fit.ckpt"
    fit = zoo.fit(
        zoo.models.LeNet5(hidden=20),
        "diagonal",
        train,
        num_steps=steps,
        batch_size=16,
        lr=1e-3,
        **grouped(
            {
                **DIST,
                "checkpoint": checkpoint,
                "checkpoint_every": 5,
                "resume": checkpoint if resume else None,
            }
        ),
    )
    return {
        "steps": fit.steps,
        "losses": torch.tensor(fit.losses),
        "params": {n: p.detach().clone() for n, p in fit.guide.named_parameters()},
    }


def trainer(out: Path, steps: int) -> dict:
    """LeNet-5 through lightning.Trainer(strategy="ddp", devices=2) with a ModelCheckpoint."""
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger
    from torch.utils.data import DataLoader

    from zoo.lightning import BayesianModule

    train = zoo.data.mnist(None, limit=256)
    test = zoo.data.mnist(None, train=False, limit=64)
    module = BayesianModule(zoo.models.LeNet5(hidden=20), "diagonal", len(train), num_samples=4)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_steps=steps,
        val_check_interval=steps // 2,
        log_every_n_steps=2,
        callbacks=[ModelCheckpoint(dirpath=out / "ckpt", every_n_train_steps=steps // 2)],
        logger=CSVLogger(out, name="logs"),
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, DataLoader(train, batch_size=16, shuffle=True), DataLoader(test, 16))
    predicted = trainer.predict(module, DataLoader(test, batch_size=32))
    fit = module.to_fit_result()
    pred = fit.predict(test.tensors[0][:10], num_samples=4, seed=0, progress=False)
    return {
        "steps": fit.steps,
        "probs": pred.probs,
        "trainer_predict": [p.probs.shape for p in predicted],
        "params": {n: p.detach().clone() for n, p in fit.guide.named_parameters()},
        "metrics": {k: float(v) for k, v in trainer.callback_metrics.items()},
    }


def forked(out: Path, steps: int) -> dict:
    """strategy="ddp_notebook" (as in Jupyter): forked ranks hand the fit back to this process."""
    x, y = correlated_data(n=200, d=3)
    torch.set_num_threads(2)
    fit = zoo.fit(
        model_for(3),
        "diagonal",
        (x, y),
        num_steps=steps,
        batch_size=20,
        **grouped({**DIST, "strategy": "ddp_notebook"}),
    )
    return {
        "type": type(fit).__name__,
        "steps": fit.steps,
        "world_size": fit.options["world_size"],
        "threads": torch.get_num_threads(),  # Lightning's per-process count is undone
        "metrics": fit.evaluate((x, y), num_samples=4, progress=False),
    }


def resnet(out: Path, steps: int, resume: bool = False) -> dict:
    """A small ResNet (batch norm) on random images, a checkpoint every 2 steps: the ranks
    average their running statistics every step. A constant rate, as :func:`lenet`'s: the
    resumed run was planned for fewer steps."""
    torch.manual_seed(0)
    x = torch.randn(64, 1, 12, 12, generator=torch.Generator().manual_seed(1))
    y = (x.mean((1, 2, 3)) > 0).long()
    checkpoint = out / "resnet.ckpt"
    fit = zoo.fit(
        zoo.models.ResNet(depth=8, in_channels=1, width=4, input_size=12),
        "lowrank",
        (x, y),
        num_steps=steps,
        batch_size=8,
        lr=1e-3,
        **grouped(
            {**DIST, "checkpoint": checkpoint, "checkpoint_every": 2,
             "resume": checkpoint if resume else None}
        ),
    )  # fmt: skip
    return {
        "steps": fit.steps,
        "losses": torch.tensor(fit.losses),
        "params": {n: p.detach().clone() for n, p in fit.guide.named_parameters()},
        "buffers": {n: b.detach().clone() for n, b in fit.model.named_buffers()},
    }


def measured(out: Path, steps: int) -> dict:
    """A fit given no rate on two ranks: each sweeps with the ranks' mean gradients and losses
    (zoo.training.rate), so both choose the same rate and stay one fit."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(640, 6, generator=g)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
    fit = zoo.fit(
        BayesianMLP(6, (16,), 2, task="classification"),
        "diagonal",
        (x, y),
        num_steps=steps,
        batch_size=32,
        **grouped(DIST),
    )
    return {
        "steps": fit.steps,
        "lr_test": {k: v for k, v in fit.options["lr_test"].items() if k != "seconds"},
        "lr": fit.options["lr"],
        "params": {n: p.detach().clone() for n, p in fit.guide.named_parameters()},
    }


SCENARIOS = {
    "measured": measured,
    "resnet": resnet,
    "resnet-resume": lambda out, steps: resnet(out, steps, resume=True),
    "forked": forked,
    "trainer": trainer,
    "conjugate": conjugate,
    "failing": failing,
    "lenet": lenet,
    "lenet-resume": lambda out, steps: lenet(out, steps, resume=True),
}

if __name__ == "__main__":
    scenario, out, steps = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    out.mkdir(parents=True, exist_ok=True)
    result = SCENARIOS[scenario](out, steps)
    torch.save(result, out / f"{scenario}-rank{RANK}.pt")
