"""A running fit's position (:class:`LoopState`) and the checkpoint that holds it: written and
read in this one place.

Persistence is three modules, one story: :mod:`zoo.persist` is the file format (atomic writes
of plain data that load without unpickling code, a guide or a model as plain data, RNG states);
this module saves a fit that is still running, to resume it exactly; :mod:`zoo.result` saves a
finished one (``FitResult.save``, ``zoo.load``), to predict with. A callback sees neither: it
gets a :class:`zoo.FitState`, a read-only view of one step.

A checkpoint is plain data: the loop state below, the guide (its
spec and state dict), the model's own parameters and buffers, the optimiser's and the
schedule's state dicts, and the random number generators' states. Resuming a fit with the same
arguments continues it: with in-memory data on the CPU, to the same parameters as an
uninterrupted fit.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

import torch

from zoo import persist


@dataclass
class LoopState:
    """The loop's position and history (what a checkpoint resumes; :class:`zoo.FitState` is
    what a callback sees of it after each step).

    Attributes
    ----------
    step, epoch : int
        Optimiser steps taken (skipped ones included) and completed epochs.
    done_in_epoch : int
        Batches of the current epoch already taken.
    epoch_start_state : Tensor
        The shuffling generator's state at the start of the current epoch (a resumed fit
        replays the epoch's order and skips the batches done).
    epoch_partial : list of float
        Losses of the current epoch so far.
    losses, epoch_losses, skipped_steps, wall_time
        As in :class:`zoo.FitResult`.
    """

    step: int = 0
    epoch: int = 0
    done_in_epoch: int = 0
    epoch_start_state: torch.Tensor | None = None
    epoch_partial: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    epoch_losses: list[float] = field(default_factory=list)
    skipped_steps: list[int] = field(default_factory=list)
    wall_time: float = 0.0

    def end_epoch(self, generator: torch.Generator) -> None:
        """Close the epoch: its mean loss joins ``epoch_losses``."""
        if self.epoch_partial:
            self.epoch_losses.append(sum(self.epoch_partial) / len(self.epoch_partial))
        self.epoch, self.done_in_epoch, self.epoch_partial = self.epoch + 1, 0, []
        self.epoch_start_state = generator.get_state()


def write_checkpoint(
    path: str | os.PathLike,
    *,
    state: LoopState,
    guide,
    model,
    optimizer,
    scheduler,
    generator: torch.Generator,
    options: dict,
    rank_rng: list | None = None,
) -> None:
    """Write everything a resumed fit needs to ``path``, atomically. ``rank_rng``: the
    generator states of every rank of a distributed fit (:func:`zoo.persist.torch_rng_state`)."""
    trainable = {}
    if isinstance(model, torch.nn.Module):
        trainable = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    persist.atomic_save(
        {
            "format": persist.FORMAT,
            "version": persist.VERSION,
            "kind": "checkpoint",
            "guide": persist.guide_payload(guide),
            "model": {**persist.model_payload(model), "trainable": trainable},
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "rng": persist.rng_state(generator),
            "state": dataclasses.asdict(state),
            "options": persist.plain_data(options),
            "rank_rng": rank_rng,
        },
        path,
    )


def restore_rank_generator(payload: dict, ranks) -> bool:
    """Put this rank's weight-draw generator state back from a checkpoint written by as many
    ranks; ``False`` (nothing restored) when the checkpoint holds no state for this layout."""
    states = payload.get("rank_rng")
    if not states or len(states) != ranks.world_size:
        return False
    persist.set_torch_rng_state(states[ranks.rank])
    return True


def read_checkpoint(path: str | os.PathLike, guide=None) -> dict:
    """The payload of a checkpoint, on the CPU (RNG states must stay CPU tensors); with
    ``guide`` (what the resuming fit was given), refused when it names another family."""
    payload = persist.read(path, "checkpoint", map_location="cpu")
    if "state" not in payload:
        raise ValueError(
            f"{path} is a checkpoint of bnn-zoo before version {persist.VERSION}, which cannot be "
            "resumed; start the fit again (zoo.load(path, allow_pickle=True) reads its guide)"
        )
    if guide is not None:
        check_resumed_family(path, payload["guide"], guide)
    return payload


def check_resumed_family(path, saved_guide: dict, guide) -> None:
    """Refuse to resume a checkpoint of one family as a fit of another: ``guide`` is what the
    resumed ``zoo.fit`` was given (a family name or a class; an instance or a factory is not
    compared)."""
    import inspect

    import guides

    saved = saved_guide.get("spec", {}).get("family")
    if saved is None or not (isinstance(guide, str) or inspect.isclass(guide)):
        return
    cls = guides.get(guide) if isinstance(guide, str) else guide
    given = getattr(cls, "family", None)
    if given is not None and given != saved:
        raise ValueError(
            f"resume={str(path)!r} is a checkpoint of the {saved!r} family, but this fit was "
            f"given {given!r}; pass guide={saved!r} to resume it, or drop resume= to start a "
            f"new {given!r} fit"
        )


def restore(payload: dict, model, optimizer, scheduler, generator) -> LoopState:
    """Put a checkpoint's model parameters, optimiser, schedule and RNG states back; returns
    the training state."""
    trainable = payload["model"].get("trainable", {})
    if trainable and isinstance(model, torch.nn.Module):
        with torch.no_grad():
            params = dict(model.named_parameters())
            for name, value in trainable.items():
                params[name].copy_(value)
    optimizer.load_state_dict(payload["optimizer"])
    if scheduler is not None and payload["scheduler"] is not None:
        scheduler.load_state_dict(payload["scheduler"])
    persist.set_rng_state(payload["rng"], generator)
    return LoopState(**payload["state"])
