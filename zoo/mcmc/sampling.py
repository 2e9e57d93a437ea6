"""A reference posterior by Markov chain Monte Carlo on the zoo model itself, with the
full-batch likelihood, in several chains of a sampler (:mod:`zoo.mcmc.samplers`; Pyro's NUTS by
default).

``ref = zoo.reference(model, (X, y))`` (:func:`reference`) samples the exact posterior
``p(w | data)`` of the same model a guide is fitted to, and returns a :class:`Reference` that
predicts like a fit (the same :class:`~zoo.Prediction` objects, so every metric and plot works
on it), converts to ArviZ (a ``chain`` dimension, NUTS' sample statistics) and saves as plain
data. ``zoo.compare(..., reference=ref)`` and :mod:`zoo.evaluation.agreement` say how close each
variational family comes to it.

Cost: every NUTS transition evaluates the full-data gradient up to ``2^max_tree_depth`` times,
so full-batch HMC is for small networks on data that fit in memory: :class:`Budget` states the
limits that :func:`reference` enforces before sampling.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from zoo.arguments import check_int, check_positive, check_seed, is_int, refuses_moved_keywords
from zoo.data.checks import check_data
from zoo.data.forms import Data, gather_tensors, nbytes, size
from zoo.mcmc import chain as hmc
from zoo.mcmc.samplers import NUTS, Sampler, check_sampler
from zoo.models.base import BayesianModel
from zoo.results.hmc import Reference
from zoo.runtime import children
from zoo.runtime.serial import one_at_a_time
from zoo.runtime.threads import example_flops, intra_op_threads
from zoo.storage import files


@dataclass(frozen=True)
class Budget:
    """What :func:`reference` agrees to sample; raise a field to go past it knowingly.

    Attributes
    ----------
    parameters : int
        Most latent scalars (weights, biases, a noise): NUTS with a diagonal mass matrix mixes
        ever more slowly as the dimension grows, and BNN posteriors are multimodal.
    gradient_flops : float
        Most floating-point operations of one full-data gradient, estimated as three forward
        passes over every example (``3 N F``, ``F`` the network's forward FLOPs per example).
    data_bytes : int
        Most bytes of ``(X, y)`` held in memory: HMC needs every example at every gradient.
    """

    parameters: int = 20_000
    gradient_flops: float = 2e9
    data_bytes: int = 1 << 30


class ReferenceTooLargeError(ValueError):
    """The model or data is past the :class:`Budget` of full-batch HMC."""


#: The keywords of NUTS' settings that ``reference`` took before samplers were objects.
MOVED = {key: f"sampler=zoo.NUTS({key}=...)" for key in ("target_accept", "max_tree_depth", "jit")}


@one_at_a_time
@refuses_moved_keywords(MOVED)
def reference(
    model: BayesianModel,
    data: Data,
    *,
    sampler: Sampler = NUTS(),
    chains: int = 4,
    warmup: int = 500,
    draws: int = 500,
    seed: int = 0,
    checkpoint: str | os.PathLike | None = None,
    chunk: int = 50,
    processes: int | str = "auto",
    budget: Budget = Budget(),
    progress: bool = True,
) -> Reference:
    """Sample the posterior of ``model`` given all of ``data`` with ``sampler`` (Pyro's NUTS by
    default).

    Parameters
    ----------
    model : zoo.models.BayesianModel
        The same model a guide is fitted to: ``model(x, y)`` observes ``y`` in the ``"data"``
        plate. Every example enters every gradient (no minibatch scaling).
    data : (X, y), Dataset or DataLoader
        The training data, gathered into memory (refused past ``budget.data_bytes``).
    sampler : Sampler
        The sampler of every chain, with its own settings: ``zoo.NUTS(target_accept=0.8,
        max_tree_depth=10, jit=True)`` by default (:mod:`zoo.mcmc.samplers`).
    chains, warmup, draws : int
        Independent chains, each with ``warmup`` adaptation transitions (discarded) and
        ``draws`` kept ones.
    seed : int
        Chain ``c`` starts from a draw of the prior and runs on a generator seeded from
        ``(seed, c)``; the caller's random state is left as it was.
    checkpoint : path, optional
        A folder: each chain writes ``chain<c>.pt`` after warm-up and after every ``chunk``
        draws (atomically). Calling again with the same folder, model, data and settings
        resumes every chain where it stopped and continues with exactly the draws an
        uninterrupted run makes; a larger ``draws`` extends a finished run.
    processes : "auto" or int
        Chains run in this many forked processes at once (``"auto"``: one per CPU core, at most
        one per chain; 1 runs them here, one after another, as it must on CUDA).
    budget : Budget
        The limits checked before sampling (:class:`ReferenceTooLargeError` past them).
    progress : bool
        One bar over every chain's transitions.

    Returns
    -------
    Reference
    """
    check_sampler(sampler)
    check_settings(chains, warmup, draws, seed, checkpoint, chunk)
    x, y = _in_memory(data, budget)
    device = files.device_of(model) or torch.device("cpu")
    x, y = x.to(device), y.to(device)
    check_data(model, x, y)
    _check_no_batch_statistics(model)
    check_budget(model, x, y, budget)
    settings = hmc.ChainSettings(warmup, draws, chunk, seed, sampler)
    workers = _workers(processes, chains, device)
    start = time.perf_counter()
    with children.scratch_folder("zoo-hmc-") as scratch:
        folder = Path(checkpoint) if checkpoint is not None else Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        for c in range(chains):  # a checkpoint of another run is refused here, before any work
            if hmc.chain_path(folder, c).exists():
                hmc.check_resumable(
                    hmc.read_chain(hmc.chain_path(folder, c)), settings, c, x, y, model
                )
        _run_chains(model, x, y, settings, chains, folder, workers, progress)
        states = [hmc.read_chain(hmc.chain_path(folder, c)) for c in range(chains)]
    per_chain = [hmc.stacked(s) for s in states]
    draws_ = {k: torch.stack([d[k][:draws] for d, _ in per_chain]) for k in per_chain[0][0]}
    stats = {k: torch.stack([s[k][:draws] for _, s in per_chain]) for k in sampler.stat_names}
    options = {**settings.as_dict(), "chains": chains, "processes": workers, "examples": len(x)}
    return Reference(model, draws_, stats, time.perf_counter() - start, options, device)


def check_settings(chains, warmup, draws, seed, checkpoint, chunk) -> None:
    """Refuse settings no run can use, before any work: counts that are not whole numbers
    (``warmup`` may be 0), a checkpoint that is a file (the sampler checks its own)."""
    check_positive(chains=chains, draws=draws, chunk=chunk)
    check_int("warmup", warmup, 0, meaning="warm-up transitions per chain")
    check_seed(seed)
    if checkpoint is not None and Path(checkpoint).exists() and not Path(checkpoint).is_dir():
        raise ValueError(
            f"checkpoint={str(checkpoint)!r} is a file: a reference's checkpoint is a folder "
            "(one file per chain); pass a folder path"
        )


def check_budget(model, x: torch.Tensor, y: torch.Tensor, budget: Budget) -> None:
    """Refuse a model or data past ``budget``, saying which limit and what to do."""
    draw = hmc.prior_draw(model, x[:2], y[:2])
    size = sum(value.numel() for value in draw.values())
    if size > budget.parameters:
        raise ReferenceTooLargeError(
            f"the model has {size:,} latent scalars, past the reference's budget of "
            f"{budget.parameters:,} (MCMC mixes slowly in high dimension and every draw costs "
            "many full-data gradients): sample a smaller network, or pass "
            "budget=zoo.ReferenceBudget(parameters=...) to go on knowingly"
        )
    per_example = example_flops(model.network, x[:2], draw)
    flops = 3 * len(x) * per_example
    if flops > budget.gradient_flops:
        raise ReferenceTooLargeError(
            f"one full-data gradient costs about {flops:.2g} FLOPs ({len(x):,} examples x "
            f"{per_example:.3g} per forward pass x 3), past the reference's budget of "
            f"{budget.gradient_flops:.2g}: use fewer examples or a smaller network, or pass "
            "budget=zoo.ReferenceBudget(gradient_flops=...) to go on knowingly"
        )


def _in_memory(data, budget: Budget) -> tuple[torch.Tensor, torch.Tensor]:
    """``(X, y)`` of ``data``, refusing a data set past ``budget.data_bytes`` before reading it
    all where its length is known."""

    known = nbytes(data)
    if known is not None:
        _refuse_bytes(known, size(data) or 0, budget)
    x, y = gather_tensors(data)
    _refuse_bytes(x.numel() * x.element_size() + y.numel() * y.element_size(), len(x), budget)
    return x, y


def _refuse_bytes(size: int, n: int, budget: Budget) -> None:
    if size > budget.data_bytes:
        raise ReferenceTooLargeError(
            f"the data ({n:,} examples, about {size / 2**20:,.0f} MiB) do not fit the "
            f"reference's budget of {budget.data_bytes / 2**20:,.0f} MiB in memory, and every "
            "HMC gradient needs all of them: use a subset, or pass "
            "budget=zoo.ReferenceBudget(data_bytes=...) to go on knowingly"
        )


def _workers(processes, chains: int, device: torch.device) -> int:
    if processes == "auto":
        processes = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    if not is_int(processes) or processes < 1:
        raise ValueError(f"processes must be 'auto' or a positive int, got {processes!r}")
    forkable = "fork" in multiprocessing.get_all_start_methods()
    return 1 if device.type != "cpu" or not forkable else min(processes, chains)


def _run_chains(model, x, y, settings, chains: int, folder: Path, workers: int, progress: bool):
    """Every chain to its draws: here one after another, or in ``workers`` forked processes
    (one intra-op thread each) with one progress bar fed by a shared counter."""
    total = chains * (settings.warmup + settings.draws)
    bar = tqdm(total=total, desc="hmc", unit="transition", disable=not progress, leave=False)
    with bar:
        if workers == 1:
            counter = _BarCounter(bar, chains)
            with intra_op_threads(1 if x.device.type == "cpu" else None):
                for c in range(chains):
                    hmc.run_chain(model, x, y, settings, c, folder, counter)
            return
        context = multiprocessing.get_context("fork")
        counter = context.Array("l", chains, lock=False)
        parent = os.getpid()
        procs = [
            context.Process(
                target=_chain_process, args=(model, x, y, settings, c, folder, counter, parent)
            )
            for c in range(chains)
        ]
        _supervise(procs, workers, counter, bar)


def _chain_process(model, x, y, settings, chain, folder, counter, parent: int) -> None:
    children.die_with_parent(parent)  # a killed zoo.reference leaves no chain running
    torch.set_num_threads(1)  # this process's own setting: one core per chain
    hmc.run_chain(model, x, y, settings, chain, folder, counter)


def _supervise(procs: list, workers: int, counter, bar) -> None:
    """Run ``procs`` ``workers`` at a time; raise if one fails (the others are stopped)."""
    try:
        children.supervise(procs, workers, tick=lambda: bar.update(sum(counter) - bar.n))
    except children.ChildFailed as failed:
        if failed.stalled:
            raise RuntimeError(
                f"chain {failed.index}'s process {failed} and was stopped with the others; the "
                "finished chunks are in the checkpoint folder, if one was given"
            ) from None
        raise RuntimeError(
            f"chain {failed.index}'s process ended with exit code {failed.exitcode} (its error "
            "is printed above); the finished chunks of every chain are in the "
            "checkpoint folder, if one was given, and resume from there"
        ) from None


class _BarCounter:
    """``counter[chain] += n`` advancing a tqdm bar (the in-process route)."""

    def __init__(self, bar, chains: int):
        self.bar, self.counts = bar, [0] * chains

    def __getitem__(self, chain: int) -> int:
        return self.counts[chain]

    def __setitem__(self, chain: int, value: int) -> None:
        self.bar.update(value - self.counts[chain])
        self.counts[chain] = value


def _check_no_batch_statistics(model) -> None:
    """Refuse a network with batch norm's running statistics: its output in training mode
    depends on the other examples of the batch, so the full-batch likelihood HMC samples would
    be another model than the one a fit's predictions use (its running statistics)."""
    if getattr(model, "_statistics", None):
        raise ValueError(
            "the HMC reference needs a network whose output for an example depends only on its "
            f"weights and that example; this one has batch norm ({len(model._statistics)} "
            "running-statistics buffers, e.g. "
            f"{model._statistics[0]!r}). Sample a network without batch norm (layer or group "
            "norm keep examples apart), or compare the families with each other"
        )
