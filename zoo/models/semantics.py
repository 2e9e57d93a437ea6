"""What a network means, kept when it becomes a Bayesian model.

:class:`~zoo.models.BayesianModel` reads these rules from the network when it is built:

Fixed normalisation layers
    A normalisation layer that keeps running statistics and whose parameters are all
    deterministic and not trainable (``requires_grad=False``: a frozen, trained body under a
    Bayesian last layer) is *fixed*: it stays in evaluation mode whatever the model's mode, so a
    fit reads its running statistics and never overwrites them with its few batches. A layer
    without affine parameters follows the model's mode (nothing says it is frozen).
Padding rows
    The ``padding_idx`` row of an ``nn.Embedding`` or ``nn.EmbeddingBag`` whose weight is a
    site is fixed at zero, as PyTorch keeps it (its gradient is zero): it is not part of the
    site, whose shape has one row fewer, so padding tokens add nothing to a prediction.
Fan-in
    A site's prior (``N(0, gain^2 / fan_in)`` by default) reads the inputs that feed one of
    its layer's outputs (:func:`fan_ins`): the site's shape says it for linear, convolution,
    recurrent and attention weights and their biases (:func:`guides.site.fan_in`); an
    embedding's lookup reads one row of its weight, so its fan-in is 1 (not
    ``embedding_dim``), which puts PyTorch's ``N(0, 1)`` initialisation within a prior
    standard deviation of zero.
The output contract
    The network returns one tensor: ``(B, C)`` logits for classification, ``(B,)`` or ``(B, D)``
    for regression. A tuple (a bare ``nn.LSTM``'s ``(output, (h, c))``) or another rank is
    refused on the first call, with what to do (``from_module(..., output=0)``, a reshape).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from guides.site import fan_in
from zoo.models.likelihoods import shape_n
from zoo.models.statistics import TRACKING_LAYERS


def fixed_norm_layers(net: nn.Module, deterministic: Iterable[str]) -> tuple[str, ...]:
    """Names of ``net``'s normalisation layers that keep running statistics and whose
    parameters (at least one) are all deterministic and not trainable."""
    fixed = set(deterministic)
    names = []
    for prefix, module in net.named_modules():
        if not isinstance(module, TRACKING_LAYERS) or not module.track_running_stats:
            continue
        own = list(module.named_parameters(recurse=False))
        full = [f"{prefix}.{leaf}" if prefix else leaf for leaf, _ in own]
        if own and all(n in fixed for n in full) and not any(p.requires_grad for _, p in own):
            names.append(prefix)
    return tuple(names)


EMBEDDINGS = (nn.Embedding, nn.EmbeddingBag)


def fan_ins(net: nn.Module, site_shapes: dict[str, torch.Size]) -> dict[str, int]:
    """``{site: fan-in}`` of every site of ``net``: :func:`guides.site.fan_in` of its shape,
    and 1 for an embedding's weight (a lookup reads one row) unless another layer reads the
    same tensor as its weight (an output layer tied to the embedding keeps its shape's)."""
    out = {name: fan_in(name, site_shapes) for name in site_shapes}
    others = {
        id(p)
        for m in net.modules()
        if not isinstance(m, EMBEDDINGS)
        for p in m.parameters(recurse=False)
    }
    for prefix, module in net.named_modules():
        name = f"{prefix}.weight" if prefix else "weight"
        if isinstance(module, EMBEDDINGS) and name in out and id(module.weight) not in others:
            out[name] = 1
    return out


def padding_rows(net: nn.Module, sites: set[str]) -> dict[str, int]:
    """``{site name: padding row}`` for the embeddings of ``net`` with a ``padding_idx`` whose
    weight is among ``sites`` (the row as a non-negative index)."""
    rows = {}
    for prefix, module in net.named_modules():
        if not isinstance(module, EMBEDDINGS):
            continue
        idx = module.padding_idx
        name = f"{prefix}.weight" if prefix else "weight"
        if idx is not None and name in sites:
            rows[name] = int(idx) % module.num_embeddings
    return rows


def site_shape(shape: torch.Size, row: int | None) -> torch.Size:
    """The site's shape for a parameter of ``shape``: one row fewer for a padding row."""
    if row is None:
        return shape
    return torch.Size((shape[0] - 1,) + tuple(shape[1:]))


def without_row(value: torch.Tensor, row: int) -> torch.Tensor:
    """``value`` ``(..., V, D)`` without row ``row`` of dim -2: ``(..., V - 1, D)``."""
    return torch.cat([value[..., :row, :], value[..., row + 1 :, :]], dim=-2)


def with_zero_row(value: torch.Tensor, row: int) -> torch.Tensor:
    """``value`` ``(..., V - 1, D)`` with a row of zeros put in at ``row``: ``(..., V, D)``."""
    zero = value.new_zeros(value.shape[:-2] + (1,) + value.shape[-1:])
    return torch.cat([value[..., :row, :], zero, value[..., row:, :]], dim=-2)


def check_output(out, task: str, network: str) -> None:
    """Refuse an output of ``network`` that the likelihood of ``task`` cannot read."""
    if not torch.is_tensor(out):
        kind = type(out).__name__
        size = f" of {len(out)}" if isinstance(out, (tuple, list, dict)) else ""
        raise TypeError(
            f"{network} returns a {kind}{size}, not one tensor (a bare nn.LSTM returns "
            "(output, (h, c))); choose the output with zoo.models.from_module(net, output=0) "
            "(an index, a key or a function of the output), or wrap the network"
        )
    if task == "classification" and out.dim() != 2:
        raise ValueError(
            f"{network} returns outputs of shape {shape_n(tuple(out.shape[1:]))}; "
            "classification takes logits of shape (batch, classes): a (batch, 1, classes) "
            "output would score every example against every label. Reshape it in the network "
            "(out.flatten(1), out[:, -1]) or choose a part with from_module(net, output=...)"
        )
    if task == "regression" and out.dim() not in (1, 2):
        raise ValueError(
            f"{network} returns outputs of shape {shape_n(tuple(out.shape[1:]))}; "
            "regression takes (batch,) or (batch, outputs): flatten it in the network"
        )
