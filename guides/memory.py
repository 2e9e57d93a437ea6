"""What a family's fit takes in memory, counted before anything is allocated.

A fit holds every variational parameter with its gradient, Adam's two moments and the
denominator Adam's step forms (:data:`BYTES_PER_PARAMETER`, 20 bytes in float32), and per step
what its family draws: for each weight a draw, its noise, their gradients and the family's own
temporaries (:meth:`guides.site.SitePosterior.step_bytes`: 20 bytes a weight by default, 12
for point masses, more for the families whose draw is a product of factors). Activations and
the data come on top. The per-step figures are peaks measured on large networks by ``python
benchmarks/step_memory.py``, which prints each family's measured peak beside this
count. A guide counts its sites' parameters on PyTorch's ``meta`` device when it is set up and
refuses, before allocating them, a fit larger than the machine (:func:`check_fit_memory`);
:meth:`guides.PerSiteGuide.fit_memory` states it afterwards. A joint family's factor over the
scalars it chooses is checked once they are chosen (:func:`guides.joint_gaussian.check_size`).
The parameters per weight of each family are in ``docs/families.md`` ("Memory").
"""

from __future__ import annotations

import math
from typing import Any

import torch

from guides.checks import physical_memory

__all__ = [
    "BYTES_PER_PARAMETER",
    "check_fit_memory",
    "fit_memory",
    "site_parameters",
]

#: Bytes each variational parameter takes in a fit: its float32 value, its gradient, Adam's
#: two moments and the denominator of Adam's step.
BYTES_PER_PARAMETER = 20


def site_parameters(cls: Any, shape: Any, scale: float, options: dict) -> int:
    """The variational parameters a site of class ``cls`` holds for a weight of ``shape``,
    counted by building it on PyTorch's ``meta`` device (no memory is allocated)."""
    init = torch.zeros(shape, device="meta")
    return sum(p.numel() for p in cls(init, scale, **options).parameters())


def fit_memory(parameters: int, step: int) -> int:
    """Bytes a fit of ``parameters`` variational parameters takes at least, whose step holds
    ``step`` bytes besides (the sum of its sites' :meth:`~guides.site.SitePosterior.step_bytes`):
    :data:`BYTES_PER_PARAMETER` a parameter, and the step's (activations and the data come on
    top)."""
    return parameters * BYTES_PER_PARAMETER + step


def check_fit_memory(label: str, plans: list, memory: int | None = None) -> int:
    """Refuse, before any parameter is allocated, a guide whose fit cannot fit in this
    machine's memory (``memory`` bytes; default :func:`physical_memory`), naming the GiB it
    needs and the sites that need most. ``plans``: ``(name, site class, shape, init scale,
    options)`` per site. Returns the bytes (:func:`fit_memory`)."""
    counts = {name: site_parameters(cls, shape, scale, options)
              for name, cls, shape, scale, options in plans}  # fmt: skip
    weights = sum(math.prod(shape) for _, _, shape, _, _ in plans)
    step = sum(cls.step_bytes(tuple(shape), options) for _, cls, shape, _, options in plans)
    needed = fit_memory(sum(counts.values()), step)
    memory = physical_memory() if memory is None else memory
    if memory is not None and needed > memory:
        largest = sorted(counts, key=counts.__getitem__, reverse=True)[:3]
        listed = ", ".join(f"{n!r} {counts[n]:,}" for n in largest)
        raise ValueError(
            f"a {label} guide of this model holds {sum(counts.values()):,} variational "
            f"parameters over {weights:,} weights: its fit needs at least "
            f"{needed / 2**30:,.1f} GiB ({BYTES_PER_PARAMETER} bytes a parameter: value, "
            f"gradient and Adam's state; {step / max(weights, 1):.0f} a weight in a step: its "
            f"draw, noise and gradients), more than this machine's {memory / 2**30:,.1f} GiB. "
            "The largest sites "
            f"hold {listed}. Choose a family with fewer parameters per weight (docs/families.md, "
            "'Memory'), its smaller options (a lower rank, diagonal factors), or guides.AutoMixed "
            "to give the largest layers the diagonal family"
        )
    return needed
