"""Posterior predictive from ``S`` sampled networks, evaluated in blocks of draws and inputs."""

from __future__ import annotations

import functools
from pathlib import Path

import torch
from pyro.infer.autoguide import AutoGuide
from torch.overrides import TorchFunctionMode
from tqdm import tqdm

from zoo.arguments import check_positive, check_seed
from zoo.data.checks import check_inputs
from zoo.models.base import BayesianModel
from zoo.models.per_draw import draw_statistics
from zoo.models.predictions import Prediction
from zoo.models.statistics import evaluation_mode
from zoo.runtime.distributed import Ranks
from zoo.runtime.rng import seeded
from zoo.runtime.serial import one_at_a_time
from zoo.runtime.threads import intra_op_threads, prediction_threads

#: Seconds before the prediction progress bar appears: short predictions print nothing.
PROGRESS_DELAY = 2.0
#: Bounds of the CPU inputs per pass that :func:`cpu_batch_size` picks.
CPU_BATCH_RANGE = (16, 4096)
#: The most bytes :func:`cpu_batch_size` lets a pass's largest activation take on the CPU.
CPU_ACTIVATION_CAP = 16 << 20


class _LargestActivation(TorchFunctionMode):
    """Records the size in bytes of the largest tensor with ``batch`` rows that any torch
    function returns (activations; weights and their views have other leading sizes)."""

    def __init__(self, batch: int):
        super().__init__()
        self.batch = batch
        self.largest = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.dim() and t.shape[0] == self.batch:
                self.largest = max(self.largest, t.numel() * t.element_size())
        return out


@functools.cache
def last_level_cache_bytes() -> int:
    """Size of the CPU's last-level cache (Linux sysfs), 32 MiB where it cannot be read."""
    sizes = []
    for entry in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            if (entry / "type").read_text().strip() == "Instruction":
                continue
            text = (entry / "size").read_text().strip().upper()
            unit = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
            sizes.append(int(text.rstrip("KM")) * unit)
        except (OSError, ValueError):
            continue
    return max(sizes, default=32 << 20)


def fitted_guide_device(guide) -> torch.device:
    """The device of a guide that has parameters; a clear error for anything else."""
    if isinstance(guide, str) or isinstance(guide, type):
        raise TypeError(
            f"predict needs a fitted guide (fit.guide, or a guide you trained), not {guide!r}: "
            "fit one first, e.g. fit = zoo.fit(model, 'diagonal', data); fit.predict(x)"
        )
    if getattr(guide, "prototype_trace", True) is None:
        guide._require_setup()
    params = list(guide.parameters()) if hasattr(guide, "parameters") else []
    if not params:
        raise ValueError(f"the guide {type(guide).__name__} has no parameters to sample from")
    return params[0].device


def cpu_batch_size(model, x: torch.Tensor, params: dict[str, torch.Tensor]) -> int:
    """Inputs per CPU pass: as many as keep the largest activation of one pass within a third of
    the last-level cache and ``CPU_ACTIVATION_CAP`` (16 MiB), within ``CPU_BATCH_RANGE``, found
    by running the network on three inputs. Larger passes are slower on the CPU, not faster:
    past the cache, glibc maps each pass's large activations afresh (page faults, system time);
    ``benchmarks/predict_batch.py`` at ``f4036f7`` measures it.
    """
    with torch.no_grad():
        # Three rows (repeated if x has fewer): a leading size that weights are unlikely to share.
        probe = x[:3].to(next(iter(params.values())).device)
        probe = probe[torch.arange(3, device=probe.device) % probe.shape[0]]
        with _LargestActivation(probe.shape[0]) as sizes:
            model.network(probe, {k: v[0] for k, v in params.items()})
        per_example = max(sizes.largest / probe.shape[0], 1.0)
        low, high = CPU_BATCH_RANGE
        budget = min(last_level_cache_bytes() // 3, CPU_ACTIVATION_CAP)
        return int(min(max(budget // per_example, low), high))


@one_at_a_time
@torch.no_grad()
def predict(
    model: BayesianModel,
    guide: AutoGuide | None,
    x: torch.Tensor,
    num_samples: int = 100,
    batch_size: int | None = None,
    sample_batch_size: int | None = None,
    params: dict[str, torch.Tensor] | None = None,
    progress: bool = True,
    seed: int | None = 0,
    distributed: bool = False,
    threads: int | str | None = "auto",
) -> Prediction:
    """Draw ``num_samples`` networks from ``guide`` and evaluate them on ``x``.

    Work is done in blocks of ``sample_batch_size`` networks x ``batch_size`` inputs, each one
    vectorised pass (``torch.func.vmap`` over the draws), so memory stays bounded for large
    inputs and many samples. The same weight draws are used for every input. ``params``
    (``{site: (S, *shape)}``) evaluates given draws instead of new ones (``guide`` may then be
    ``None``, as for :meth:`zoo.results.hmc.Reference.predict`).

    Defaults (``benchmarks/predict_time.py`` measures them): ``sample_batch_size=None``
    evaluates one draw per pass (a plain forward; ``vmap`` over draws turns convolutions into
    grouped ones, no faster); ``batch_size=None`` takes 8192 inputs per pass on CUDA, where small
    passes leave the GPU waiting on kernel launches, and on the CPU as many as keep a pass's
    largest activation within a third of the last-level cache and 16 MiB
    (:func:`cpu_batch_size`). Pass ``sample_batch_size > 1`` to vectorise over draws.

    ``progress`` shows a tqdm bar over the passes once a prediction has run for
    ``PROGRESS_DELAY`` (2) seconds; ``False`` never shows one. ``seed`` fixes the weight draws
    without changing the caller's random state; the default, 0, is the seeding rule of
    ``evaluate`` and ``to_arviz`` too, so one call gives one answer (``None``: draws from the
    global generator, and advances it).

    ``distributed=True``, called on every rank of a distributed run (after
    ``zoo.Engine(devices=...)``, under ``torchrun``...): rank 0's weight draws go to every rank,
    each evaluates its contiguous ``1/W`` of ``x``, and the outputs are gathered once, so every
    rank returns the prediction one process would make with those draws.

    ``threads``: torch's intra-op CPU threads for the passes, as ``zoo.fit``'s (``"auto"``: one
    thread when a pass is small, :mod:`zoo.runtime.threads`), the caller's setting restored after.

    The network runs in evaluation mode, whatever its mode, which is back as it was afterwards:
    batch norm reads its running statistics, as after ``model.eval()``, or, where the model
    keeps training inputs for them (a fit's default, :mod:`zoo.models.per_draw`), each
    draw's own statistics on those inputs.
    """
    check_positive(
        num_samples=num_samples, batch_size=batch_size, sample_batch_size=sample_batch_size
    )
    check_seed(seed)
    with evaluation_mode(model):  # batch norm reads its running statistics
        if params is None:
            device = fitted_guide_device(guide)
        else:  # given draws (a reference's, or a guide's drawn by the caller): no guide needed
            device = next(iter(params.values())).device
        check_inputs(model, x, device)
        x0 = x
        ranks = Ranks.of_process_group() if distributed else Ranks()
        if params is None:
            assert guide is not None  # fitted_guide_device refused anything else
            with seeded(seed, device):
                params = guide.sample_posterior(num_samples)
        else:
            num_samples = next(iter(params.values())).shape[0]
        ranks.broadcast_(params.values())
        n = x.shape[0]
        lo, hi = ranks.shard_bounds(n)
        x = x[lo:hi]
        if sample_batch_size is None:
            sample_batch_size = 1
        if batch_size is None:
            batch_size = 8192 if device.type == "cuda" else cpu_batch_size(model, x0, params)
        step = max(1, int(sample_batch_size))
        first = {k: v[0] for k, v in params.items()}
        block = min(batch_size, max(x.shape[0], 1))
        num_threads = prediction_threads(
            threads, device, model.network, x0[:2].to(device), first, batch_size=block
        )
        with intra_op_threads(num_threads):
            outputs = _passes(model, x, x0, params, num_samples, batch_size, step, device, progress)
        outputs = ranks.gather_rows(outputs, n, dim=1)
        return model.likelihood.predict(outputs, params)


def _passes(model, x, x0, params, num_samples, batch_size, step, device, progress) -> torch.Tensor:
    """The network's outputs ``(S, n, ...)`` on this rank's ``x``, in blocks of ``step`` draws
    x ``batch_size`` inputs, each block of draws with its own batch norm statistics where the
    model keeps inputs for them (:mod:`zoo.models.per_draw`)."""
    starts = range(0, x.shape[0], batch_size)
    draws = range(0, num_samples, step)
    if not starts:  # an empty shard (fewer inputs than ranks): no passes, no bar
        probe = model.network(x0[:1].to(device), {k: v[0] for k, v in params.items()})
        return probe.new_empty((num_samples, 0, *probe.shape[1:]))
    bar = tqdm(
        total=len(starts) * len(draws),
        desc="predict",
        unit="pass",
        disable=not progress,
        delay=PROGRESS_DELAY,
        leave=False,
    )
    blocks = []
    with bar:
        for s in draws:
            if step == 1:  # a plain forward per draw, no vmap
                block = {k: v[s] for k, v in params.items()}
            else:
                block = {k: v[s : s + step] for k, v in params.items()}
            # each draw's batch norm statistics, on the fit's kept inputs (None: the running ones)
            own = draw_statistics(model, block)
            parts = []
            for start in starts:
                chunk = x[start : start + batch_size].to(device)
                if own is None:  # a subclass's network(x, params) need not take buffers
                    out = model.network(chunk, block)
                else:
                    out = model.network(chunk, block, buffers=own)
                parts.append(out.unsqueeze(0) if step == 1 else out)
                bar.update(1)
            blocks.append(torch.cat(parts, dim=1))
    return torch.cat(blocks, dim=0)
