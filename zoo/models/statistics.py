"""Running statistics (batch norm) of a network evaluated under many weight draws.

A normalisation layer with ``track_running_stats`` keeps buffers (``running_mean``,
``running_var``, ``num_batches_tracked``) that PyTorch updates in place on every forward pass in
training mode and reads in evaluation mode. :class:`~zoo.models.BayesianModel` keeps PyTorch's
contract for them:

training mode (``model.train()``, what ``zoo.fit`` runs in)
    each weight draw normalises with its *own* batch statistics, and the running statistics move
    by the layer's momentum towards the batch statistics *averaged over the draws of the step*:
    with ``P`` vectorised draws, ``r <- (1 - m) r + m mean_p(s_p)``, which is what PyTorch's
    update gives when the ``P`` draws' statistics are averaged (with ``momentum=None`` the
    cumulative average of PyTorch, over steps). One draw (``P = 1``, the default) is exactly
    PyTorch's update. Draws never see each other's statistics.
evaluation mode (``model.eval()``, every prediction)
    every draw normalises with the running statistics, as ``model.eval()`` does in PyTorch, or,
    where a fit left the model training inputs for them, with its own statistics on those
    inputs (:mod:`zoo.models.per_draw`, ``zoo.Run(statistics="per_draw")``).

The running statistics therefore estimate the batch statistics expected under the posterior
(they are a property of the fit, saved and resumed with it), the choice of TyXe and
bayesian-torch, whose networks update them with each sampled network in turn.

Inside :func:`frozen_statistics` (the library's own traces that are not a training step: the
guide's set-up, the checks of the data and of a saved file) training mode still uses batch
statistics but leaves the running ones unchanged.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Mapping
from typing import TypeGuard

import torch
from torch import nn
from torch.func import functional_call, vmap

from zoo.runtime.torch_private import NORM_LAYERS, NormLayer

#: The layer classes whose buffers may be running statistics (batch and instance norm).
TRACKING_LAYERS = NORM_LAYERS

_FROZEN = contextvars.ContextVar("frozen_statistics", default=False)


@contextlib.contextmanager
def frozen_statistics() -> Iterator[None]:
    """Within this block, no network of a :class:`~zoo.models.BayesianModel` updates its running
    statistics (training mode still normalises with the batch's). Per thread and task."""
    token = _FROZEN.set(True)
    try:
        yield
    finally:
        _FROZEN.reset(token)


def tracks_running_statistics(module: nn.Module) -> TypeGuard[NormLayer]:
    """Whether ``module`` is a normalisation layer that keeps running statistics."""
    return isinstance(module, TRACKING_LAYERS) and module.track_running_stats


def updating_layers(net) -> list[NormLayer]:
    """The normalisation layers of ``net`` that a forward pass now updates: those that track
    running statistics and are in training mode (none for anything not an ``nn.Module``)."""
    if not isinstance(net, nn.Module):
        return []
    return [m for m in net.modules() if tracks_running_statistics(m) and m.training]


@contextlib.contextmanager
def momentum_set(layers: list, momentum: float | None) -> Iterator[None]:
    """Within the block, every normalisation layer of ``layers`` has ``momentum`` (``None``:
    PyTorch's cumulative average over the block's passes; ``1.0``: each pass's batch
    statistics replace the running ones); each layer's own momentum is back afterwards, also
    after an error."""
    momenta = [m.momentum for m in layers]
    try:
        for m in layers:
            m.momentum = momentum
        yield
    finally:
        for m, own in zip(layers, momenta):
            m.momentum = own


def running_buffers(net: nn.Module) -> list[str]:
    """Names (as in ``net.named_buffers()``) of the running statistics of ``net``'s
    normalisation layers that track them."""
    names = []
    for prefix, module in net.named_modules():
        if tracks_running_statistics(module):
            for leaf, buffer in module.named_buffers(recurse=False):
                if buffer is not None:
                    names.append(f"{prefix}.{leaf}" if prefix else leaf)
    return names


def updates_statistics(net: nn.Module, names: list[str]) -> bool:
    """Whether a forward pass of ``net`` now would use batch statistics of layers that track
    running ones (a layer in training mode)."""
    return bool(names) and bool(updating_layers(net))


def batched_call(
    net: nn.Module,
    weights: Mapping[str, torch.Tensor],
    x: torch.Tensor,
    num: int,
    names: list[str],
) -> torch.Tensor:
    """``net(x)`` under ``num`` draws ``weights[name]`` of shape ``(num, *shape)``, vectorised,
    with each draw's own copy of the running statistics ``names``; the layer's update is then
    averaged over the draws into ``net``'s buffers (unless :func:`frozen_statistics`)."""
    own = dict(net.named_buffers())
    copies = {n: own[n].unsqueeze(0).expand((num,) + own[n].shape).clone() for n in names}
    out = vmap(lambda p, b: functional_call(net, (p, b), (x,)))(dict(weights), copies)
    if not _FROZEN.get():
        with torch.no_grad():
            for n in names:
                value = copies[n]
                own[n].copy_(value[0] if not value.is_floating_point() else value.mean(0))
    return out


def single_call(net: nn.Module, weights: Mapping[str, torch.Tensor], x, names) -> torch.Tensor:
    """``net(x)`` under one draw; running statistics updated in place as PyTorch does, or left
    unchanged inside :func:`frozen_statistics`."""
    if names and _FROZEN.get():
        own = dict(net.named_buffers())
        copies = {n: own[n].clone() for n in names}
        return functional_call(net, (dict(weights), copies), (x,))
    return functional_call(net, dict(weights), (x,))


def looped_call(
    call: Callable[[Mapping[str, torch.Tensor]], torch.Tensor],
    weights: Mapping[str, torch.Tensor],
    num: int,
) -> torch.Tensor:
    """``call`` on each of ``num`` draws in turn, stacked: the route for layers that
    ``torch.func.vmap`` has no rule for (PyTorch's fused ``nn.LSTM``, ``nn.GRU``, ``nn.RNN``).
    Running statistics, if any, are then updated draw after draw, as a loop in PyTorch would."""
    return torch.stack([call({n: w[k] for n, w in weights.items()}) for k in range(num)])


@contextlib.contextmanager
def evaluation_mode(module):
    """``module`` in evaluation mode inside the block (running statistics read, not updated),
    each submodule's own mode back afterwards; anything that is not an ``nn.Module`` is left
    as it is."""
    with _mode(module, training=False):
        yield module


@contextlib.contextmanager
def training_mode(module):
    """``module`` in training mode inside the block (what a fit's steps run in), each
    submodule's own mode back afterwards."""
    with _mode(module, training=True):
        yield module


@contextlib.contextmanager
def _mode(module, training: bool):
    if not isinstance(module, nn.Module):
        yield
        return
    modes = [(m, m.training) for m in module.modules()]
    module.train(training)
    try:
        yield
    finally:
        for m, was in modes:
            m.training = was


def statistics_of(model) -> list[torch.Tensor]:
    """The running-statistics buffers of a :class:`~zoo.models.BayesianModel`'s network (none
    for any other model): the state a diverged fit restores along with its parameters."""
    names = getattr(model, "_statistics", None)
    if not names:
        return []
    own = dict(model.net.named_buffers())
    return [own[n] for n in names]
