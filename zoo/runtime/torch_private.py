"""The private PyTorch names the zoo relies on, each wrapped here once (and tested in
``tests/zoo/runtime/test_torch_private.py``), with a public fallback where a release moves them.

- :data:`NORM_LAYERS`: the base of every layer that keeps running statistics (batch norm of any
  dimension, synchronised and lazy, instance norm): ``torch.nn.modules.batchnorm._NormBase``.
- :data:`DROPOUT_LAYERS`: the base of the dropout layers (``Dropout``, ``Dropout1d`` to
  ``Dropout3d``, ``AlphaDropout``, ``FeatureAlphaDropout``):
  ``torch.nn.modules.dropout._DropoutNd``.
- :func:`copy_tensors`: ``dst[i].copy_(src[i])`` for lists of tensors in one multi-tensor call
  (``torch._foreach_copy_``), which a CUDA graph records as one kernel per group.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn

__all__ = ["DROPOUT_LAYERS", "NORM_LAYERS", "NormLayer", "copy_tensors"]

_PUBLIC_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm,
                 nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d, nn.LazyBatchNorm1d,
                 nn.LazyBatchNorm2d, nn.LazyBatchNorm3d, nn.LazyInstanceNorm1d,
                 nn.LazyInstanceNorm2d, nn.LazyInstanceNorm3d)  # fmt: skip
_PUBLIC_DROPOUTS = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout,
                    nn.FeatureAlphaDropout)  # fmt: skip

if TYPE_CHECKING:
    from torch.nn.modules.batchnorm import _NormBase as NormLayer
else:  # the type of a layer with running statistics, for annotations
    NormLayer = getattr(nn.modules.batchnorm, "_NormBase", nn.Module)

#: The layers with running statistics (for ``isinstance``): the private base, or the public
#: classes where it moved.
NORM_LAYERS: tuple[type[NormLayer], ...] = (
    (nn.modules.batchnorm._NormBase,) if hasattr(nn.modules.batchnorm, "_NormBase")
    else _PUBLIC_NORMS
)  # fmt: skip
#: The dropout layers (for ``isinstance``), likewise.
DROPOUT_LAYERS: tuple[type, ...] = (
    (nn.modules.dropout._DropoutNd,) if hasattr(nn.modules.dropout, "_DropoutNd")
    else _PUBLIC_DROPOUTS
)  # fmt: skip

_FOREACH_COPY = getattr(torch, "_foreach_copy_", None)


def copy_tensors(dst: Sequence[torch.Tensor], src: Sequence[torch.Tensor]) -> None:
    """Copy each tensor of ``src`` into the tensor of ``dst`` at the same place (same shapes),
    in place: one multi-tensor call where PyTorch has it, a copy per tensor otherwise."""
    if len(dst) != len(src):
        raise ValueError(f"copy_tensors: {len(dst)} destinations for {len(src)} sources")
    if _FOREACH_COPY is not None:
        _FOREACH_COPY(list(dst), list(src))
        return
    with torch.no_grad():
        for d, s in zip(dst, src):
            d.copy_(s)
