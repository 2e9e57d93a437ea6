"""Batch norm's running statistics re-estimated at the end of a fit (``zoo.Run(statistics=
"per_draw")``, the default, and ``"refresh"``).

During a fit each normalisation layer's running statistics move by its momentum towards each
step's batch statistics (:mod:`zoo.models.statistics`): an exponential average over the last
tens of steps, taken at weights that have since moved. A short fit at a high rate ends with
statistics of networks it no longer holds, and every prediction reads them (measured in
``benchmarks/README.md`` at ``91a332b``, "Is each family's default call its best?"). The fix is
SWA's (Izmailov
et al. 2018; PyTorch's ``torch.optim.swa_utils.update_bn``, which takes a plain network, not a
posterior): one pass over the fit's training minibatches at the end, the statistics reset and
averaged over the pass with equal weight per minibatch (``momentum=None``, PyTorch's cumulative
average), each minibatch seen through the fit's own objective, so under the posterior's weight
draws as a step sees them (the average over a step's draws, :mod:`zoo.models.statistics`).

What it touches: the layers that a fit's steps update (a frozen body's fixed layers keep their
statistics); nothing else (no parameter, no gradient; the random generators are forked, so the
state after the fit is the one the steps left). Distributed ranks average their shards'
statistics. A fit without running statistics, an interrupted fit (``Ctrl-C``) and
``statistics="running"`` skip it. Its seconds count in the fit's ``wall_time``; a checkpoint
holds the statistics of its step, so a resumed fit ends, refreshed, where one run ends. It is
``zoo.fit``'s: a ``lightning.Trainer`` running :class:`zoo.lightning.BayesianModule` keeps the
steps' running averages.

Under ``"per_draw"`` the model also holds training inputs *while* it fits (:func:`hold_inputs`,
before the first step): a prediction mid-fit (a callback's, an interrupted fit's) then
normalises each draw with its own statistics, as one after the fit does, where the running
averages, one set for every draw, would fit none of a spread posterior's draws. The pass at the
end keeps its own inputs in their place.
"""

from __future__ import annotations

import torch

from zoo.inference.objective import Objective
from zoo.models.per_draw import KEPT_INPUTS, kept_size
from zoo.models.statistics import momentum_set, statistics_of, updating_layers
from zoo.runtime.distributed import Ranks
from zoo.runtime.rng import forked

__all__ = ["STATISTICS", "hold_inputs", "refresh_statistics"]

#: ``zoo.Run(statistics=...)``: re-estimated at the end of the fit, with training inputs kept
#: for each draw's own statistics (:mod:`zoo.models.per_draw`) or without, or the steps'
#: running ones.
STATISTICS = ("per_draw", "refresh", "running")


def hold_inputs(model, batches) -> bool:
    """Before a fit's first step, under ``statistics="per_draw"``: ``model`` holds training
    inputs for each draw's own statistics while it fits, so that a prediction during the fit
    (a callback's, or the ``.result`` of an interrupted, diverged or failed fit) normalises
    each draw as a prediction after it does, not with the steps' running averages, one set for
    every draw. The inputs are :func:`zoo.models.per_draw.kept_size`'s count of the training
    data, drawn at random by :meth:`zoo.data.batches.Batches.sample_inputs` (seeded 0, the
    same whatever the fit's seed and on every rank); the refresh pass at the fit's end keeps
    its own in their place. Returns whether the model holds any (not when no layer the fit
    updates tracks statistics)."""
    if not updating_layers(getattr(model, "net", None)):
        return False
    like = batches.sample_inputs(1)  # its size bounds the count; moves no fit generator
    inputs = batches.sample_inputs(kept_size(like, available=len(batches)))
    setattr(model, "statistics_inputs", inputs.detach().clone())  # noqa: B010
    return True


def refresh_statistics(
    objective: Objective, batches, ranks: Ranks | None = None, keep: bool = False
) -> int:
    """Re-estimate the running statistics of ``objective.model``'s normalisation layers that
    the fit updates, over one epoch of ``batches`` (the fit's :class:`zoo.data.batches.Batches`)
    under the guide's draws; returns the examples seen (0 when no layer tracks statistics).
    On a failure mid-pass the statistics are put back as they were. ``keep``: the model keeps
    the pass's first inputs (:func:`zoo.models.per_draw.kept_size`; rank 0's) as its
    ``statistics_inputs``, on which a prediction estimates each draw's own statistics."""
    model = objective.model
    layers = updating_layers(getattr(model, "net", None))  # not a frozen body's fixed ones
    if not layers:
        return 0
    buffers = statistics_of(model)
    kept = [b.clone() for b in buffers]
    device = next((b.device for b in buffers), torch.device("cpu"))
    seen, first = 0, []
    try:
        # PyTorch's cumulative average over the pass, each minibatch weighted alike
        with momentum_set(layers, None), torch.no_grad(), forked(device):
            for m in layers:
                m.reset_running_stats()
            for x, y in batches.epoch(0):
                objective.loss(x, y, len(batches), eager=True)
                if keep and seen < KEPT_INPUTS:
                    first.append(x[: KEPT_INPUTS - seen].detach())
                seen += len(x)
    except BaseException:
        with torch.no_grad():
            for b, k in zip(buffers, kept):
                b.copy_(k)
        raise
    ranks = ranks or Ranks()
    ranks.average_(buffers)
    if keep and first:
        inputs = ranks.gather(torch.cat(first).cpu())[0]  # rank 0's, on every rank
        kept = inputs[: kept_size(inputs)].to(device).clone()
        setattr(model, "statistics_inputs", kept)  # noqa: B010 - a zoo model's buffer
    return seen
