"""An ensemble's members fitted in forked CPU processes at once (``zoo.ensemble(...,
processes=P)``).

Members are independent fits, so ``P`` processes fit ``P`` members at a time: each child is
forked from the caller (the model factory, the data and the options are inherited, nothing is
pickled), runs :func:`zoo.fit` with the member's seed on one intra-op thread (a forked child
that runs torch's OpenMP thread pool after its parent used it hangs; so ``processes="auto"``
gives each core a member), and writes the result as a fit file (plain data, atomically) into a
scratch folder; the caller reads each file back with :func:`zoo.load`'s checks. A member that
raises ends its process with the error written beside the results, and the caller raises a
``RuntimeError`` that names the member and quotes it; a process that dies (killed, out of
memory) is named with its exit code. Either way the other members' processes are stopped, and
no process outlives the call: children end with their parent
(:func:`zoo.runtime.children.die_with_parent`), and the scratch folder of a killed call is
removed at the next.

The CPU only: a forked child cannot use a CUDA context its parent opened, and members on one
GPU would share it anyway; on a GPU members are fitted one after another.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from pathlib import Path

import torch
from tqdm.auto import tqdm

from zoo.arguments import is_int
from zoo.results.loading import load
from zoo.runtime import children
from zoo.training.fitting import fit

#: Prefix of the scratch folders that hold members' fit files until the caller reads them.
SCRATCH_PREFIX = "zoo-ensemble-"


def check_processes(processes) -> None:
    """Refuse a ``processes`` that is neither ``"auto"`` nor a positive int."""
    if processes != "auto" and (not is_int(processes) or processes < 1):
        raise ValueError(f"processes must be 'auto' or a positive int, got {processes!r}")


def workers(processes, members: int, device: torch.device) -> int:
    """The number of processes for ``processes`` (``"auto"``: one per CPU core; at most one
    per member), refusing what cannot run before any fit."""
    check_processes(processes)
    if processes == "auto":
        if device.type != "cpu" or "fork" not in multiprocessing.get_all_start_methods():
            return 1
        processes = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    if processes > 1 and device.type != "cpu":
        raise ValueError(
            f"processes={processes} fits members in forked CPU processes, but the members "
            f"would run on {device}: pass processes=1 (members one after another on the "
            "device) or engine=zoo.Engine(device='cpu')"
        )
    if processes > 1 and "fork" not in multiprocessing.get_all_start_methods():
        raise ValueError(
            f"processes={processes} needs forked processes, which this platform does not "
            "offer; pass processes=1"
        )
    return min(processes, members)


def fit_members(
    model_factory: Callable,
    family,
    data,
    seed: int,
    member_args: dict[int, dict],
    processes: int,
    bar: tqdm,
) -> list:
    """Member ``k`` = ``zoo.fit(model_factory(), family, data, seed=seed + k,
    **member_args[k])`` for each ``k`` of ``member_args``, ``processes`` members at a time in
    forked processes; the fits in member order. ``bar`` (the ensemble's progress bar)
    advances as each member ends."""

    threads = 1  # more would hang in OpenMP if this process used its pool before the fork
    context = multiprocessing.get_context("fork")
    parent, members = os.getpid(), sorted(member_args)
    with children.scratch_folder(SCRATCH_PREFIX) as scratch:
        folder = Path(scratch)
        procs = [
            context.Process(
                target=_member_process,
                args=(
                    model_factory,
                    family,
                    data,
                    seed + k,
                    member_args[k],
                    folder,
                    k,
                    parent,
                    threads,
                ),
                name=f"zoo-ensemble-member-{k}",
            )
            for k in members
        ]
        start = bar.n

        def tick():
            bar.update(start + len(list(folder.glob("member*.pt"))) - bar.n)

        try:
            children.supervise(procs, processes, tick=tick)
        except children.ChildFailed as failed:
            raise RuntimeError(_failure(failed, members[failed.index], folder)) from None
        tick()
        return [load(folder / f"member{k}.pt", model=model_factory()) for k in members]


def _member_process(model_factory, family, data, seed, fit_args, folder, k, parent, threads):
    """One member's fit in a forked child: its result, or its error, as a file in ``folder``."""
    children.die_with_parent(parent)  # a killed zoo.ensemble leaves no member running
    torch.set_num_threads(threads)  # this process's own setting

    try:
        result = fit(model_factory(), family, data, seed=seed, **fit_args)
        result.save(folder / f"member{k}.pt")
    except BaseException as err:  # noqa: BLE001 -- reported to the parent, then exit
        (folder / f"member{k}.error").write_text(f"{type(err).__name__}: {err}")
        os._exit(1)


def _failure(failed: children.ChildFailed, k: int, folder: Path) -> str:
    """The message of member ``k`` whose process failed: its error, or its exit code."""
    error = folder / f"member{k}.error"
    if failed.stalled:
        return (
            f"ensemble member {k}'s process {failed}: it was stopped with the other "
            "members' (a member that waits on something that never comes, such as a lock)"
        )
    if error.exists():
        return f"ensemble member {k} failed in its process: {error.read_text()}"
    return (
        f"ensemble member {k}'s process ended with exit code {failed.exitcode} "
        "(killed, or out of memory?); the other members' processes were stopped"
    )
