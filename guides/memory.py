"""What a family's fit takes in memory, counted before anything is allocated.

A fit holds every variational parameter with its gradient and Adam's two moments
(:data:`BYTES_PER_PARAMETER`, 16 bytes in float32), and per step a draw of every weight with its
gradient (:data:`BYTES_PER_WEIGHT_DRAWN`, 8 bytes); activations, the optimiser's temporaries and
a family's own work come on top. A guide counts its sites' parameters on PyTorch's ``meta``
device when it is set up and refuses, before allocating them, a fit larger than the machine
(:func:`check_fit_memory`); :meth:`guides.PerSiteGuide.fit_memory` states it afterwards. A joint
family's factor over the scalars it chooses is checked once they are chosen
(:func:`guides.joint_gaussian.check_size`). The parameters per weight of each family are in
``docs/families.md`` ("Memory").
"""

from __future__ import annotations

import math
from typing import Any

import torch

from guides.checks import physical_memory

__all__ = [
    "BYTES_PER_PARAMETER",
    "BYTES_PER_WEIGHT_DRAWN",
    "check_fit_memory",
    "fit_memory",
    "site_parameters",
]

#: Bytes each variational parameter takes in a fit: its float32 value, its gradient and Adam's
#: two moments.
BYTES_PER_PARAMETER = 16
#: Bytes each weight takes in a step besides: one float32 draw and its gradient.
BYTES_PER_WEIGHT_DRAWN = 8


def site_parameters(cls: Any, shape: Any, scale: float, options: dict) -> int:
    """The variational parameters a site of class ``cls`` holds for a weight of ``shape``,
    counted by building it on PyTorch's ``meta`` device (no memory is allocated)."""
    init = torch.zeros(shape, device="meta")
    return sum(p.numel() for p in cls(init, scale, **options).parameters())


def fit_memory(parameters: int, weights: int) -> int:
    """Bytes a fit of ``parameters`` variational parameters over ``weights`` weights takes at
    least: :data:`BYTES_PER_PARAMETER` each, and a draw with its gradient per weight
    (activations, the optimiser's temporaries and a family's own work come on top)."""
    return parameters * BYTES_PER_PARAMETER + weights * BYTES_PER_WEIGHT_DRAWN


def check_fit_memory(label: str, plans: list, memory: int | None = None) -> int:
    """Refuse, before any parameter is allocated, a guide whose fit cannot fit in this
    machine's memory (``memory`` bytes; default :func:`physical_memory`), naming the GiB it
    needs and the sites that need most. ``plans``: ``(name, site class, shape, init scale,
    options)`` per site. Returns the bytes (:func:`fit_memory`)."""
    counts = {name: site_parameters(cls, shape, scale, options)
              for name, cls, shape, scale, options in plans}  # fmt: skip
    weights = sum(math.prod(shape) for _, _, shape, _, _ in plans)
    needed = fit_memory(sum(counts.values()), weights)
    memory = physical_memory() if memory is None else memory
    if memory is not None and needed > memory:
        largest = sorted(counts, key=counts.__getitem__, reverse=True)[:3]
        listed = ", ".join(f"{n!r} {counts[n]:,}" for n in largest)
        raise ValueError(
            f"a {label} guide of this model holds {sum(counts.values()):,} variational "
            f"parameters over {weights:,} weights: its fit needs at least "
            f"{needed / 2**30:,.1f} GiB ({BYTES_PER_PARAMETER} bytes a parameter: value, "
            f"gradient and Adam's moments; {BYTES_PER_WEIGHT_DRAWN} a weight: its draw and "
            f"gradient), more than this machine's {memory / 2**30:,.1f} GiB. The largest sites "
            f"hold {listed}. Choose a family with fewer parameters per weight (docs/families.md, "
            "'Memory'), its smaller options (a lower rank, diagonal factors), or guides.AutoMixed "
            "to give the largest layers the diagonal family"
        )
    return needed
