"""Batch norm's statistics per weight draw: what a prediction normalises each draw with after a
fit with ``zoo.Run(statistics="per_draw")``, the default.

In training mode every weight draw normalises with its *own* batch statistics
(:mod:`zoo.models.statistics`); the running statistics are one set, averaged over the draws. A
network's statistics are a function of its weights, and under a posterior whose draws differ
(a variational family, MC dropout) one draw's activation means and variances can be far from
the average: normalised with the average, each sampled network is one the fit never trained,
and the predictive can be worse on the *training* data than the networks it averages
(``benchmarks/README.md`` at ``91a332b``, "Batch norm's statistics per draw").

So at the end of such a fit (:mod:`zoo.training.refresh`) the model keeps some of its training
inputs, ``model.statistics_inputs``: the first :func:`kept_size` inputs of one pass of the fit's
training minibatches, at most :data:`KEPT_INPUTS` inputs and :data:`KEPT_BYTES` bytes. Every
prediction then estimates each draw's statistics on them before it predicts
(:func:`draw_statistics`): for every normalisation layer that the fit updates, the draw's batch
statistics over all the kept inputs in one pass (mean and unbiased variance per channel, as
PyTorch's running update takes them), whatever passes the prediction itself is split into. A
frozen body's fixed layers read their running statistics as before. While it fits, the model
holds a random sample of as many training inputs (:func:`zoo.training.refresh.hold_inputs`),
so that a prediction during the fit (a callback's, an interrupted fit's) normalises each draw
alike. The cost is one forward pass of the kept inputs per draw; a saved fit holds the kept
inputs (they are training data). A fit with ``statistics="refresh"`` or ``"running"``, a
network without running statistics, and a ``lightning.Trainer`` run keep none, and every draw
reads the running statistics.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch.func import functional_call, vmap

from zoo.models.statistics import (
    evaluation_mode,
    looped_call,
    momentum_set,
    training_mode,
    updating_layers,
)

__all__ = [
    "KEPT_BYTES",
    "KEPT_INPUTS",
    "check_kept_inputs",
    "draw_statistics",
    "kept_size",
    "network_with",
]

#: The most training inputs a fit keeps for its draws' statistics: a few of the fit's own
#: minibatches, whose batch statistics are what each draw was trained to normalise with.
KEPT_INPUTS = 512

#: The most bytes of kept inputs (a saved fit holds them): fewer inputs for large ones.
KEPT_BYTES = 64 << 20


def kept_size(inputs: torch.Tensor, available: int | None = None) -> int:
    """How many of ``inputs`` (``(N, ...)``), or of ``available`` inputs shaped like them, a
    fit keeps: ``N`` (or ``available``), :data:`KEPT_INPUTS` and :data:`KEPT_BYTES` bytes'
    worth, whichever is least (at least one)."""
    per_input = max(inputs[:1].numel() * inputs.element_size(), 1)
    count = len(inputs) if available is None else available
    return max(1, min(count, KEPT_INPUTS, KEPT_BYTES // per_input))


def check_kept_inputs(inputs, where: str, model=None) -> None:
    """Refuse kept inputs that are not a non-empty tensor ``(N, ...)`` of finite values (a
    changed file); ``where`` names what holds them. With ``model`` (holding its fitted
    state), also inputs the model's network does not take: another dtype than its weights'
    (token indices: int64 or int32), another shape than its ``input_shape``, or one its
    network refuses when run once on two of them."""
    what = f"{where}: the kept training inputs of batch norm's per-draw statistics"
    if not torch.is_tensor(inputs) or inputs.dim() < 1 or len(inputs) == 0:
        raise ValueError(
            f"{what} must be a non-empty tensor (N, ...), got {type(inputs).__name__}: the "
            "file was changed"
        )
    if inputs.is_floating_point() and not bool(torch.isfinite(inputs).all()):
        raise ValueError(
            f"{what} hold values that are not finite: the file was changed or written by a "
            "diverged fit"
        )
    if model is not None:
        _check_taken(inputs, what, model)


def _check_taken(inputs: torch.Tensor, what: str, model) -> None:
    """Refuse kept inputs ``model``'s network does not take (see :func:`check_kept_inputs`)."""
    changed = "the file was changed or saved for another model"
    weight = next(model.net.parameters(), None)
    tokens = getattr(model, "takes_tokens", False)
    wanted = (torch.int64, torch.int32) if tokens else (getattr(weight, "dtype", inputs.dtype),)
    if inputs.dtype not in wanted:
        raise ValueError(
            f"{what} are {inputs.dtype}, where the model takes {' or '.join(map(str, wanted))}: "
            f"{changed}"
        )
    expected = getattr(model, "input_shape", None)
    shape = tuple(inputs.shape[1:])
    if expected is not None and shape != tuple(expected):
        raise ValueError(
            f"{what} have shape (N, {', '.join(map(str, shape))}), where the model takes "
            f"(N, {', '.join(map(str, expected))}): {changed}"
        )
    probe = inputs[:2].to(weight.device) if weight is not None else inputs[:2]
    try:
        with torch.no_grad(), evaluation_mode(model):
            model.network(probe, model.net_means(copy=False))
    except (RuntimeError, IndexError, ValueError, TypeError) as err:  # the network's refusal
        raise ValueError(
            f"{what}, of shape {tuple(inputs.shape)} and dtype {inputs.dtype}, are not what the "
            f"model's network takes ({str(err).splitlines()[0]}): {changed}"
        ) from None


def draw_statistics(model, params: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
    """Each draw's running statistics estimated on ``model.statistics_inputs`` (see the module
    notes): ``{buffer: (S, *shape)}`` for draws ``params`` ``{site: (S, *site_shape)}``, or
    ``{buffer: shape}`` for one draw without the leading dim; ``None`` when the model keeps no
    inputs or the network has no running statistics (every draw reads the running ones). One
    pass of all the kept inputs per draw, so a prediction does not depend on how it is split
    into passes."""
    inputs = getattr(model, "statistics_inputs", None)
    names = list(getattr(model, "_statistics", ()))
    if inputs is None or not names:
        return None
    first = next(iter(model.site_shapes))
    single = params[first].dim() == len(model.site_shapes[first])
    weights = {
        n: model.to_parameter(n, w.unsqueeze(0) if single else w)
        for n, w in params.items()
        if n in model.site_shapes
    }
    own = dict(model.net.named_buffers())
    per_draw = []
    with torch.no_grad(), training_mode(model):
        # each pass's batch statistics replace the running ones on the layers the fit updates
        # (a frozen body's fixed layers stay in evaluation mode and read theirs)
        with momentum_set(updating_layers(model.net), 1.0):
            for k in range(weights[first].shape[0]):
                copies = {n: own[n].clone() for n in names}  # a fixed layer's stay as they are
                draw = {n: w[k] for n, w in weights.items()}
                functional_call(model.net, (draw, copies), (inputs,))
                per_draw.append(copies)
    if single:
        return per_draw[0]
    return {n: torch.stack([c[n] for c in per_draw]) for n in names}


def network_with(model, x: torch.Tensor, weights: dict, buffers: dict, lead: tuple) -> torch.Tensor:
    """The network's raw output on ``x`` under ``weights`` (site-shaped, after ``lead``: no
    draw dim, or one, ``(S,)``), each draw reading its own ``buffers`` (as
    :func:`draw_statistics` returns them) in place of the network's running statistics."""
    if len(lead) > 1:
        raise ValueError(f"per-draw statistics take one draw dim, got draws of {lead}")
    drawn = bool(lead)
    net = model.net
    weights = {n: model.to_parameter(n, w) for n, w in weights.items()}
    if not drawn:
        return functional_call(net, (weights, buffers), (x,))
    if model._vectorised:
        try:
            return vmap(lambda p, b: functional_call(net, (p, b), (x,)))(weights, buffers)
        except RuntimeError as err:  # an operation vmap cannot batch: .item(), a branch
            if "vmap" not in str(err):
                raise
            model._vectorised = False  # one draw after another from now on
    num = next(iter(weights.values())).shape[0]
    # a weight's and a buffer's names differ: one mapping per draw holds both
    return looped_call(
        lambda state: functional_call(net, dict(state), (x,)), weights | buffers, num
    )
