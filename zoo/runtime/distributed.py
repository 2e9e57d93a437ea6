"""The processes of a fit: one, or several on Lightning Fabric (``zoo.Engine(devices=...)``).

Fabric starts the processes (its launcher, ``torchrun``, SLURM: Lightning's cluster
environments) and sets up the process group; :class:`Ranks` holds what a step needs from it.

The ELBO across ranks
---------------------
With ``W`` processes each rank draws its own minibatch of ``B`` examples from its shard of the
data (a fresh shuffle per epoch, shared by all ranks, split ``W`` ways; the last shard is padded
by wrapping round so that every rank takes the same number of steps) and its own weight draws.
Each rank's loss scales its likelihood by ``N / B`` exactly as one process does
(:mod:`zoo.inference.elbo`), so each is an unbiased estimate of the full-data ``-ELBO`` and of its
gradient; the ranks' gradients are averaged (one all-reduce per step, as DDP does), which is again
unbiased, with the variance of a ``W B`` minibatch. The reported loss is the ranks' mean.

Why not the DDP module wrapper: the loss is not the forward pass of one module (Pyro traces the
model and the guide), so the gradients are averaged explicitly after ``backward``; the same
reduction also carries the loss and a failure flag per rank, so that every rank takes the same
decision (update, skip, stop) at every step and a rank that fails makes the others stop with an
error naming it instead of waiting forever.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NamedTuple

import torch

from zoo.runtime.children import die_with_parent, scratch_folder
from zoo.runtime.devices import chosen_device
from zoo.runtime.packages import require_torchvision

#: Lightning strategies a fit can run on (data-parallel ones; ``"auto"`` lets Lightning pick).
STRATEGIES = ("auto", "ddp", "ddp_spawn", "ddp_fork", "ddp_notebook")
INSTALL_HINT = (
    'pip install "bnn-zoo[distributed]" (or pip install lightning) to fit across devices or nodes'
)


class RankFailedError(RuntimeError):
    """Another process of a distributed fit failed or disappeared; the message names it."""


def fabric_class():
    """Lightning's ``Fabric``, imported on first use with a clear message when it is missing
    (or when torchvision, which it imports, is broken)."""
    require_torchvision("a distributed fit (Lightning)")
    try:
        from lightning.fabric import Fabric
    except ImportError as err:  # pragma: no cover - lightning is in the dev extra
        raise ImportError(f"{INSTALL_HINT} ({err})") from None
    return Fabric


def requested(devices, num_nodes, strategy) -> bool:
    """Whether ``zoo.fit``'s arguments ask for Lightning (anything but one device, one node
    and the automatic strategy)."""
    return devices not in (1, "1") or num_nodes != 1 or strategy != "auto"


def process_rank() -> int:
    """This process's global rank in the running process group (0 without one)."""
    dist = torch.distributed
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def accelerator_for(device, accelerator: str) -> str:
    """Lightning's accelerator for ``zoo.fit``'s ``device`` and ``accelerator`` arguments
    (``device="cuda"`` means ``accelerator="gpu"``; ``"auto"`` the device ``$ZOO_DEVICE``
    names, if set: :mod:`zoo.runtime.devices`); a clear error when they disagree, or when a GPU
    is asked for on a machine without one."""
    if device == "auto":
        device = chosen_device() or "auto"
    if device == "auto":
        if accelerator == "gpu" and not torch.cuda.is_available():
            raise ValueError(
                "accelerator='gpu', but this machine has no usable CUDA device (torch "
                f"{torch.__version__} sees none): pass accelerator='cpu' or 'auto'"
            )
        return accelerator
    device = torch.device(device)
    kind = {"cuda": "gpu"}.get(device.type, device.type)
    if device.index is not None or accelerator not in ("auto", kind):
        raise ValueError(
            f"device={str(device)!r} and accelerator={accelerator!r} disagree: across processes "
            "name the hardware with accelerator= ('cpu', 'gpu', 'auto') and which or how many "
            "with devices= (e.g. devices=[0, 1])"
        )
    return kind


def launch(function: Callable, *, accelerator, devices, num_nodes, strategy, rebuild=None):
    """Run ``function(ranks)`` in every process of a Fabric run; returns rank 0's result.

    With ``"ddp"`` (and under ``torchrun`` or SLURM) this process is rank 0 and its result is
    returned as it is. The spawned or forked strategies (``"ddp_spawn"``, ``"ddp_fork"``,
    ``"ddp_notebook"``) run ``function`` in child processes: rank 0 saves its fit to a temporary
    file as plain data and this process reads it with ``rebuild(path)`` (on the CPU). Lightning
    gives each process ``cores / processes`` intra-op threads; this process's count is restored
    afterwards."""
    if isinstance(strategy, str) and strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES} (data parallel), got {strategy!r}")
    fabric = fabric_class()(
        accelerator=accelerator, devices=devices, num_nodes=num_nodes, strategy=strategy
    )
    threads = torch.get_num_threads()  # Lightning sets cores / processes in this process
    try:
        with scratch_folder("zoo-fit-") as folder:
            handoff = Path(folder) / "rank0.fit"
            try:
                result = fabric.launch(
                    functools.partial(_in_process, function, os.getpid(), handoff)
                )
            except torch.multiprocessing.ProcessExitedException as err:
                raise RankFailedError(_exited(err)) from err
            return rebuild(result.path) if isinstance(result, _SavedFit) else result
    finally:
        torch.set_num_threads(threads)


def _exited(err) -> str:
    """What a rank that ended without an error of its own tells the others."""
    how = f"signal {err.signal_name}" if err.signal_name else f"exit code {err.exit_code}"
    return (
        f"rank {err.error_index} (process {err.error_pid}) of the distributed fit ended with "
        f"{how}, so the fit stopped; a checkpoint= written before resumes it (run.resume)"
    )


class _SavedFit(NamedTuple):
    path: Path


def _in_process(function: Callable, parent: int, handoff: Path, fabric):
    if os.getpid() != parent:  # a spawned or forked rank: it ends with the process it serves
        die_with_parent(parent)
    result = function(Ranks(fabric))
    if os.getpid() == parent:
        return result
    if fabric.global_rank == 0:  # a child process: hand the fit over as a file, not a pickle
        result.save(handoff)
        return _SavedFit(handoff)
    return None


class Ranks:
    """This process's place in a fit: ``rank`` of ``world_size`` on ``device``, and the
    collectives of a step. ``Ranks()`` is a single process, where every method is free."""

    def __init__(self, fabric=None):
        self.fabric = fabric
        self.rank = fabric.global_rank if fabric is not None else 0
        self.world_size = fabric.world_size if fabric is not None else 1
        self.device: torch.device | None = fabric.device if fabric is not None else None

    @classmethod
    def of_process_group(cls) -> Ranks:
        """The ranks of the running process group (``zoo.Engine(devices=...)``, ``torchrun``,
        a Lightning ``Trainer``); a clear error when there is none."""
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError(
                "distributed=True needs the processes of a distributed run (zoo.fit with "
                "devices/num_nodes, torchrun, a Lightning Trainer), called on every rank; "
                "there is no process group here: use distributed=False"
            )
        ranks = cls()
        ranks.rank, ranks.world_size = dist.get_rank(), dist.get_world_size()
        if dist.get_backend() == "nccl":
            ranks.device = torch.device("cuda", torch.cuda.current_device())
        return ranks

    def shard_bounds(self, n: int) -> tuple[int, int]:
        """This rank's contiguous rows ``[lo, hi)`` of ``n`` (``ceil(n / W)`` each, the last
        ones shorter or empty)."""
        per = -(-n // self.world_size)
        return min(self.rank * per, n), min((self.rank + 1) * per, n)

    def gather_rows(self, t: torch.Tensor, n: int, dim: int = 0) -> torch.Tensor:
        """Every rank's :meth:`shard_bounds` rows of ``t`` (along ``dim``), concatenated in
        rank order: the full ``n`` rows on every rank (one all-gather)."""
        if not self.distributed:
            return t
        per = -(-n // self.world_size)
        pad = per - t.shape[dim]
        if pad:
            shape = list(t.shape)
            shape[dim] = pad
            t = torch.cat([t, t.new_zeros(shape)], dim=dim)
        t = t.contiguous()
        parts = [torch.empty_like(t) for _ in range(self.world_size)]
        self._collective(torch.distributed.all_gather, parts, t)
        return torch.cat(parts, dim=dim).narrow(dim, 0, n)

    @property
    def is_global_zero(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def seed(self, seed: int) -> int:
        """This rank's seed for its weight draws (``seed`` itself on a single process)."""
        if not self.distributed:
            return seed
        mixed = torch.Generator().manual_seed(seed * 1_000_003 + self.rank)
        return int(torch.randint(2**62, (), generator=mixed))

    def broadcast_(self, tensors: Iterable[torch.Tensor]) -> None:
        """Rank 0's values into ``tensors`` on every rank (in place)."""
        if not self.distributed:
            return
        with torch.no_grad():
            for t in tensors:
                self._collective(torch.distributed.broadcast, t.data, src=0)

    def average_step(
        self, loss: torch.Tensor | None, params: list[torch.Tensor], step: int, error=None
    ) -> torch.Tensor:
        """Average the gradients of ``params`` and ``loss`` over the ranks, in place; every rank
        returns the same mean loss. ``error``: this rank's step failed (the others learn which
        rank, then all raise). A parameter that no rank gave a gradient keeps ``None``."""
        if not self.distributed:
            assert loss is not None, "one process raises its step's error itself"
            return loss
        dev = params[0].device
        meta = torch.zeros(2 + self.world_size + len(params), dtype=torch.float64, device=dev)
        if loss is not None and error is None:
            meta[0] = loss.detach().double()
        meta[1] = 1.0  # ranks that contributed a loss
        meta[2 + self.rank] = float(error is not None)
        has = [p.grad is not None and error is None for p in params]
        meta[2 + self.world_size :] = torch.tensor(has, dtype=torch.float64)
        buckets = _flat_gradients(params, has)
        for flat in [meta, *buckets.values()]:
            self._collective(torch.distributed.all_reduce, flat, step=step)
        failed = [r for r in range(self.world_size) if meta[2 + r] > 0]
        if failed:
            if error is not None:
                raise error
            raise RankFailedError(
                f"rank {failed[0]} of {self.world_size} failed at step {step} (its own error is "
                f"in its output); rank {self.rank} stops too"
            )
        _unflatten_gradients(params, meta[2 + self.world_size :] > 0, buckets, self.world_size)
        assert loss is not None  # a rank whose step failed raised above
        return (meta[0] / self.world_size).to(loss.dtype)

    def average_(self, tensors: list[torch.Tensor], step: int | None = None) -> None:
        """The mean over the ranks into each floating-point tensor of ``tensors``, in place
        (one collective; every rank passes the same list): batch norm's running statistics,
        which each rank updates from its own minibatch."""
        if not self.distributed:
            return
        floats = [t for t in tensors if t.is_floating_point()]
        if not floats:
            return
        with torch.no_grad():
            flat = torch.cat([t.reshape(-1).double() for t in floats])
            self._collective(torch.distributed.all_reduce, flat, step=step)
            flat /= self.world_size
            for t, part in zip(floats, flat.split([t.numel() for t in floats])):
                t.copy_(part.view_as(t))

    def mean(self, value: float, step: int | None = None) -> float:
        """The mean of a float over the ranks; ``step``: the fit's step, named if a rank fails."""
        if not self.distributed:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        self._collective(torch.distributed.all_reduce, t, step=step)
        return float(t) / self.world_size

    def any(self, flag: bool, step: int | None = None) -> bool:
        """Whether ``flag`` is true on any rank."""
        return self.mean(float(bool(flag)), step) > 0 if self.distributed else bool(flag)

    def gather(self, obj, step: int | None = None) -> list:
        """``obj`` of every rank, in rank order, on every rank."""
        if not self.distributed:
            return [obj]
        out = [None] * self.world_size
        self._collective(torch.distributed.all_gather_object, out, obj, step=step)
        return out

    def _collective(self, op, *args, step: int | None = None, **kwargs) -> None:
        try:
            op(*args, **kwargs)
        except (RuntimeError, OSError) as err:
            where = f" at step {step}" if step is not None else ""
            other = f"rank {1 - self.rank}" if self.world_size == 2 else "another rank"
            raise RankFailedError(
                f"rank {self.rank} of {self.world_size}: a collective{where} failed, so {other} "
                f"stopped (killed, out of memory, or crashed: see its output): {err}"
            ) from err


def _flat_gradients(params: list[torch.Tensor], has: list[bool]) -> dict:
    """One flat buffer of gradients per dtype (zeros where a parameter has none here)."""
    buckets: dict[torch.dtype, list[torch.Tensor]] = {}
    for p, h in zip(params, has):
        g = p.grad if h and p.grad is not None else torch.zeros_like(p)
        buckets.setdefault(p.dtype, []).append(g.reshape(-1))
    return {dtype: torch.cat(gs) for dtype, gs in buckets.items()}


def _unflatten_gradients(params, has_any, buckets: dict, world_size: int) -> None:
    offsets = dict.fromkeys(buckets, 0)
    for p, h in zip(params, has_any.tolist()):
        flat, start = buckets[p.dtype], offsets[p.dtype]
        offsets[p.dtype] = start + p.numel()
        if h:
            p.grad = flat[start : start + p.numel()].view_as(p).div_(world_size)
        else:
            p.grad = None
