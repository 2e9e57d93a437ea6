"""How many CPU threads a fit's step runs on.

A small network's step is host work and tiny kernels: intra-op parallelism cannot speed it up,
and it can make it much slower. Every parallel region is a barrier that waits for all threads of
the pool; when another process holds a core (a browser, a second job, a shared CI runner), one of
them is descheduled and the whole step waits for it. A large network's matrix products do gain
from the threads. ``zoo.Engine(threads="auto")`` (the default) therefore runs the step on one
thread when the network's forward pass is small, and leaves torch's setting alone otherwise; on
CUDA it changes nothing. The caller's setting is restored after the fit. Prediction
(``predict``, ``evaluate``, ``to_arviz``, ``compare``'s evaluations) takes the same rule, with
``F`` the forward pass of one block of inputs under one weight draw
(:func:`prediction_threads`), and the same ``threads=`` argument.

The rule, with ``F`` the floating-point operations of one forward pass of the minibatch
(matrix products and convolutions, counted by ``torch.utils.flop_counter.FlopCounterMode``)::

    threads = 1                         if F < SMALL_STEP_FLOPS
              torch.get_num_threads()   otherwise (the caller's setting)

``benchmarks/threads.py`` at ``f4036f7`` measured the step time at one and at several threads,
alone and beside a competing process, across network sizes; ``benchmarks/README.md`` at
``91a332b`` has the numbers behind the threshold.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pyro.poutine as poutine
import torch
from torch.utils.flop_counter import FlopCounterMode

from zoo.arguments import is_int
from zoo.runtime.rng import forked

#: A step whose forward pass (one minibatch) is below this many floating-point operations is
#: "small": on the CPU it runs on one thread under ``threads="auto"`` (``benchmarks/threads.py`` at
#: ``f4036f7`` and ``benchmarks/README.md`` at ``91a332b`` have the numbers).
SMALL_STEP_FLOPS = 20_000_000


def threads_for(
    threads: int | str | None, device: torch.device, flops: Callable[[], float]
) -> int | None:
    """The intra-op thread count for a step: ``None`` to leave torch's setting. ``threads`` is
    ``"auto"`` (the table's rule; ``flops`` is called only then, on the CPU), a positive int,
    or ``None``."""
    if threads != "auto":
        return None if threads is None else int(threads)
    if device.type != "cpu":
        return None
    return 1 if flops() < SMALL_STEP_FLOPS else None


def forward_flops(model: Callable, *args, **kwargs) -> int:
    """Floating-point operations (matrix products, convolutions) of one call of ``model``,
    counted without gradients, without recording Pyro sites and without advancing torch's
    random generators. A ``zoo`` model's network is counted on the ``meta`` device (shapes
    only, no arithmetic and no weight draws): its products are the model's."""
    net = getattr(model, "net", None)
    if isinstance(net, torch.nn.Module) and args and torch.is_tensor(args[0]):
        return _meta_flops(net, args[0])
    counter = FlopCounterMode(display=False)
    device = args[0].device if args and torch.is_tensor(args[0]) else None
    with forked(device), torch.no_grad(), poutine.block(), counter:
        model(*args, **kwargs)
    return int(counter.get_total_flops())


def example_flops(model: Callable, x: torch.Tensor, *args) -> float:
    """:func:`forward_flops` of ``model`` on ``x`` (and ``args``) per example of ``x``: a
    feed-forward pass's count grows linearly with the batch, so a count on a few examples,
    times a batch size, is that batch's."""
    return forward_flops(model, x, *args) / max(len(x), 1)


def _meta_flops(net: torch.nn.Module, x: torch.Tensor) -> int:
    """The count on the ``meta`` device; a network that reads a value of its weights or
    input (``.item()``, a branch on a tensor: a meta tensor has none) is counted on its own
    weights and ``x`` instead, with copies of its buffers (its running statistics unchanged)."""
    tensors = [*net.named_parameters(), *net.named_buffers()]
    params = {name: torch.empty_like(value, device="meta") for name, value in tensors}
    counter = FlopCounterMode(display=False)
    try:
        with torch.no_grad(), counter:
            torch.func.functional_call(net, params, (torch.empty_like(x, device="meta"),))
    except (RuntimeError, NotImplementedError):  # a data-dependent operation
        own = {name: value.detach().clone() for name, value in tensors}
        counter = FlopCounterMode(display=False)
        with forked(x.device), torch.no_grad(), counter:
            torch.func.functional_call(net, own, (x,))
    return int(counter.get_total_flops())


def check_threads(threads) -> None:
    """Refuse a ``threads`` argument that is not ``"auto"``, ``None`` or a positive int."""
    if threads is None or threads == "auto":
        return
    if not is_int(threads) or threads < 1:
        raise ValueError(f"threads must be 'auto', None or a positive int, got {threads!r}")


@contextlib.contextmanager
def intra_op_threads(threads: int | None) -> Iterator[None]:
    """Torch's intra-op thread count set to ``threads`` inside the block (``None``: unchanged),
    and the caller's count back afterwards."""
    if threads is None or threads == torch.get_num_threads():
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def prediction_threads(
    threads: int | str | None,
    device: torch.device,
    network: Callable,
    x: torch.Tensor,
    params: dict,
    batch_size: int | None = None,
) -> int | None:
    """The intra-op thread count for a prediction whose passes run ``network`` under one weight
    draw ``params`` on blocks of ``batch_size`` inputs (default: ``len(x)``):
    :func:`zoo.runtime.threads.threads_for`'s rule on the forward pass of one block, counted on the
    first two inputs of ``x`` and scaled to the block, as ``zoo.fit`` weighs a minibatch."""
    check_threads(threads)
    block = len(x) if batch_size is None else int(batch_size)
    flops = lambda: round(example_flops(network, x[:2], params) * block)  # noqa: E731
    return threads_for(threads, device, flops)
