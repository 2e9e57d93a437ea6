"""What a prediction's result holds, bounded before the first draw.

A prediction returns every sampled network's outputs, ``S x N x outputs`` numbers held at
least twice (classification: the logits and the class probabilities; regression: the outputs
and the means and scales read from them). :func:`check_prediction_size` refuses, before any
weight is drawn, a call whose result could not fit in the memory of the device that holds it,
naming the numbers; :meth:`zoo.Posterior.evaluate` holds per-input sums only and is the call
for many draws.
"""

from __future__ import annotations

import torch

from guides.checks import physical_memory
from zoo.data.checks import check_inputs

__all__ = ["STACKED_PER_NETWORK", "check_prediction_size", "prediction_bytes"]

#: Bytes a prediction gathered one network at a time holds per network besides the outputs'
#: numbers (its tensors' Python objects and the allocator's blocks, as ``zoo.prior_predictive``
#: holds them).
STACKED_PER_NETWORK = 6 << 10


def prediction_bytes(
    model, rows: int, num_samples: int, dtype: torch.dtype, stacked: bool = False
) -> int:
    """Bytes a prediction of ``num_samples`` networks on ``rows`` inputs holds at least;
    ``stacked``: its outputs are gathered one network at a time and then stacked (one copy
    more)."""
    width = getattr(model, "out_features", None) or 1
    copies = (2 if getattr(model, "task", "") == "classification" else 3) + int(stacked)
    itemsize = torch.empty((), dtype=dtype).element_size()
    overhead = num_samples * STACKED_PER_NETWORK if stacked else 0
    return num_samples * rows * width * itemsize * copies + overhead


def check_prediction_size(
    model, x: torch.Tensor, num_samples: int, device: torch.device, call: str = "predict"
) -> None:
    """Refuse ``call`` (``"predict"`` or ``"prior_predictive"``, whose outputs are stacked) of
    ``num_samples`` networks on inputs ``x`` (checked against the model first: the check runs
    its network on two of them, which gives the output width) whose result would not fit in
    ``device``'s memory."""
    check_inputs(model, x, device)
    tensors = model.parameters() if isinstance(model, torch.nn.Module) else iter(())
    weight = next((p for p in tensors if p.is_floating_point()), None)
    dtype = weight.dtype if weight is not None else torch.get_default_dtype()
    prior = call == "prior_predictive"
    needed = prediction_bytes(model, len(x), num_samples, dtype, stacked=prior)
    if device.type == "cuda":
        memory: int | None = torch.cuda.get_device_properties(device).total_memory
    else:
        memory = physical_memory()
    if memory is not None and needed > memory:
        width = getattr(model, "out_features", None) or 1
        raise ValueError(
            f"{call}(num_samples={num_samples:,}) on {len(x):,} inputs would hold at least "
            f"{num_samples:,} x {len(x):,} x {width} outputs and their copies, "
            f"{needed / 2**30:,.1f} GiB, more "
            f"than this machine's {memory / 2**30:,.1f} GiB ({device.type}): ask for fewer "
            "draws or predict on fewer inputs at a time"
            + ("" if prior else ", or use evaluate(), which keeps per-input sums only")
        )
