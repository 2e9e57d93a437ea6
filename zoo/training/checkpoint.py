"""A running fit's position (:class:`LoopState`) and the checkpoint that holds it: written and
read in this one place.

Persistence is three modules, one story: :mod:`zoo.storage.files` is the file format (atomic writes
of plain data that load without unpickling code, a guide or a model as plain data, RNG states);
this module saves a fit that is still running, to resume it exactly; :mod:`zoo.results.variational`
saves a finished one (``FitResult.save``, ``zoo.load``), to predict with. A callback sees neither:
it gets a :class:`zoo.CallbackView`, a read-only view of one step.

A checkpoint is plain data: the loop state below, the guide (its
spec and state dict), the model's own parameters and buffers, the optimiser's and the
schedule's state dicts, and the random number generators' states. Resuming a fit with the same
arguments continues it: with in-memory data on the CPU, to the same parameters as an
uninterrupted fit.

What a checkpoint was made with is recorded too (:func:`fit_identity`), so that a resume
continues the same fit: a resumed fit replays its epoch's shuffle and takes the steps the
interrupted one would have taken, which holds only on the same data (its fingerprint,
:mod:`zoo.data.fingerprint`), in minibatches of the same size, with the same objective and
optimiser; :func:`check_identity` refuses a resume whose identity differs, naming what differs.
What may change on a resume: the length (``num_steps``, ``epochs``: a longer run goes on), the
progress bar, callbacks, the checkpoint cadence, the threads, ``jit``, and the number of
processes (a distributed fit resumed on another layout draws fresh weights).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from zoo.arguments import is_int
from zoo.models.statistics import statistics_of
from zoo.storage import checks as file_checks
from zoo.storage import files, guide_form, model_form


@dataclass
class LoopState:
    """The loop's position and history (what a checkpoint resumes; :class:`zoo.CallbackView` is
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
    identity: dict | None = None,
) -> None:
    """Write everything a resumed fit needs to ``path``, atomically. ``rank_rng``: the
    generator states of every rank of a distributed fit (:func:`zoo.storage.files.torch_rng_state`);
    ``identity``: the data and settings it was made with
    (:func:`fit_identity`), which a resume must match."""
    trainable = {}
    if isinstance(model, torch.nn.Module):
        trainable = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    form = model_form.model_payload(model)
    form.pop("statistics_inputs", None)  # held for mid-fit predictions: a resume holds them anew
    files.atomic_save(
        {
            "format": files.FORMAT,
            "version": files.VERSION,
            "kind": "checkpoint",
            "guide": guide_form.guide_payload(guide),
            "model": {**form, "trainable": trainable},
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "rng": files.rng_state(generator),
            "state": dataclasses.asdict(state),
            "options": files.plain_data(options),
            "rank_rng": rank_rng,
            "identity": identity,
        },
        path,
    )


def restore_rank_generator(payload: dict, ranks) -> bool:
    """Put this rank's weight-draw generator state back from a checkpoint written by as many
    ranks; ``False`` (nothing restored) when the checkpoint holds no state for this layout."""
    states = payload.get("rank_rng")
    if not states or len(states) != ranks.world_size:
        return False
    files.set_torch_rng_state(states[ranks.rank])
    return True


def read_checkpoint(path: str | os.PathLike, guide=None) -> dict:
    """The payload of a checkpoint, on the CPU (RNG states must stay CPU tensors), its loop
    state checked; with ``guide`` (the guide the resuming fit was given, built), refused when
    it is of another family or has other options."""
    payload = files.read(path, "checkpoint", map_location="cpu")
    if "state" not in payload:
        raise ValueError(
            f"{path} is a checkpoint of bnn-zoo before version {files.VERSION}, which cannot be "
            "resumed; start the fit again (zoo.load(path, allow_pickle=True) reads its guide)"
        )
    files.require(payload, ("guide", "model", "optimizer", "rng", "state"), path)
    guide_form.check_guide_payload(payload["guide"], path)
    check_loop_state(path, payload["state"])
    if guide is not None:
        check_resumed_family(path, payload["guide"], guide)
    return payload


def check_loop_state(path, state) -> None:
    """Refuse a loop state that no fit writes: counts that are not non-negative integers, a
    history whose length is not the step count, an epoch position without a shuffle state."""
    if not isinstance(state, dict):
        raise ValueError(f"{path}: the checkpoint's 'state' entry is not a loop state")
    fields = {f.name for f in dataclasses.fields(LoopState)}
    if set(state) != fields:
        raise ValueError(
            f"{path}: the checkpoint's loop state has entries {sorted(state)}, expected "
            f"{sorted(fields)}; it was not written by this version of bnn-zoo, or was changed"
        )
    for name in ("step", "epoch", "done_in_epoch"):
        value = state[name]
        if not is_int(value) or value < 0:
            raise ValueError(
                f"{path}: the checkpoint's {name} is {value!r}, not a count (an integer >= 0); "
                "the file was changed: use another checkpoint or start the fit again"
            )
    if len(state["losses"]) != state["step"]:
        raise ValueError(
            f"{path}: the checkpoint's step is {state['step']} but it holds "
            f"{len(state['losses'])} losses; the file was changed: use another checkpoint"
        )
    if state["epoch_start_state"] is not None and not torch.is_tensor(state["epoch_start_state"]):
        raise ValueError(f"{path}: the checkpoint's shuffle state is not a tensor")


def check_resumed_family(path, saved_guide: dict, guide) -> None:
    """Refuse to resume a checkpoint of one family (or of the same family with other options)
    as a fit of another: ``guide`` is the guide the resumed ``zoo.fit`` was given, built (a
    name, a class, ``guides.family(...)``, a factory or an instance)."""
    saved = saved_guide.get("spec", {})
    if not hasattr(guide, "spec") or "family" not in saved:
        return
    try:
        given = guide.spec()
    except TypeError:  # an unregistered subclass: compared by its family name, if any
        given = {"family": getattr(guide, "family", None), "options": saved.get("options")}
    same = given["family"] == saved["family"]
    if same and dict(given.get("options") or {}) == dict(saved.get("options") or {}):
        return
    name, options = saved["family"], saved.get("options") or {}
    written = f"guides.family({name!r}, {', '.join(f'{k}={v!r}' for k, v in options.items())})"
    written = written.replace(", )", ")")
    raise ValueError(
        f"resume={str(path)!r} is a checkpoint of the {name!r} family with options {options}, "
        f"but this fit was given {given['family']!r} with options {given.get('options')}: "
        f"{'other options' if same else 'another family'}. Pass guide={written} to resume "
        "it, or drop resume= to start a new fit"
    )


def check_position(path, state: LoopState, per_epoch: int) -> None:
    """Refuse a resumed position that does not fit this fit's epochs (``per_epoch`` steps):
    the loop would skip every batch of every epoch and never take a step."""
    if state.done_in_epoch >= per_epoch:
        raise ValueError(
            f"resume={str(path)!r} stopped {state.done_in_epoch} steps into an epoch, but an "
            f"epoch of this fit has {per_epoch}: the data or the batch size differ from the "
            "fit that wrote it; pass the same ones to resume it, or drop resume= to start afresh"
        )


def restore(payload: dict, model, optimizer, scheduler, generator, path=None) -> LoopState:
    """Put a checkpoint's model parameters, optimiser, schedule and RNG states back; returns
    the training state. What does not fit (another parameter's shape, an optimiser state of
    other shapes or groups) is a ``ValueError`` naming ``path`` and the entry."""
    trainable = payload["model"].get("trainable", {})
    if trainable and isinstance(model, torch.nn.Module):
        params = dict(model.named_parameters())
        expected = {n: p for n, p in params.items() if p.requires_grad}  # what is written
        file_checks.check_state(expected, trainable, "the model's trainable parameters")
        file_checks.check_tensors(trainable, path, "model state (trainable parameters)")
        with torch.no_grad():
            for name, value in trainable.items():
                params[name].copy_(value)
    _restore_statistics(payload["model"].get("state") or {}, model, path)
    try:
        optimizer.load_state_dict(payload["optimizer"])
        if scheduler is not None and payload["scheduler"] is not None:
            scheduler.load_state_dict(payload["scheduler"])
        files.set_rng_state(payload["rng"], generator)
    except (ValueError, KeyError, TypeError, RuntimeError, IndexError) as err:
        raise ValueError(
            f"{path}: the checkpoint's optimiser, schedule or generator state does not fit this "
            f"fit ({type(err).__name__}: {err}); the file was changed"
        ) from None
    _check_optimizer_state(optimizer, path)
    return LoopState(**payload["state"])


def _restore_statistics(state: dict, model, path) -> None:
    """Put the network's running statistics (batch norm's buffers) back from a checkpoint's
    model state, checked against the model's own first."""
    buffers = statistics_of(model)
    if not buffers:
        return
    expected = {f"net.{n}": b for n, b in zip(model._statistics, buffers)}
    saved = {k: v for k, v in state.items() if k in expected}
    file_checks.check_state(expected, saved, f"{path}: the network's running statistics")
    file_checks.check_statistics(saved, path, "model state (running statistics)")
    with torch.no_grad():
        for name, value in saved.items():
            expected[name].copy_(value)


def _check_optimizer_state(optimizer, path) -> None:
    """Refuse optimiser state tensors shaped unlike their parameters, or not finite."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            for key, value in optimizer.state.get(p, {}).items():
                if not torch.is_tensor(value) or value.dim() == 0:
                    continue
                if value.shape != p.shape or not torch.isfinite(value).all():
                    raise ValueError(
                        f"{path}: the checkpoint's optimiser state {key!r} has shape "
                        f"{tuple(value.shape)} for a parameter of shape {tuple(p.shape)}, or "
                        "values that are not finite; the file was changed"
                    )


# -- what a resume must match -------------------------------------------------------


def fit_identity(
    data_print: dict,
    batch_size: int,
    length,
    optim,
    loss,
    engine,
    seed=None,
    order=None,
    model_print: dict | None = None,
) -> dict:
    """The identity a checkpoint records: ``data`` (:func:`zoo.data.fingerprint.data_fingerprint`)
    and ``settings``: the values of ``zoo.fit``'s arguments that change what a step computes,
    the ``seed`` (a resumed fit continues the checkpoint's random streams: another seed would be
    a label on the same fit) and the minibatches' ``order`` (:func:`zoo.data.batches.batch_order`:
    a loader's sampler, ``shuffle=True`` or not), and ``model``, what defines the model
    (:func:`zoo.storage.model_form.model_fingerprint`). A callable schedule or KL weight is recorded
    as ``"callable"``, which cannot be compared further."""
    optimizer = optim.optimizer
    settings = {
        "batch_size": int(batch_size),
        # a rate left to the fit ("default", measured by the rate test where the fit is long
        # enough; "auto") is not a setting: the options record the rate that ran
        "lr": _rate_setting(length),
        "optimizer": optimizer if isinstance(optimizer, str) else optimizer.__name__,
        "optimizer_options": files.plain_data(dict(optim.optimizer_options or {})),
        "lr_schedule": _named(length.lr_schedule),
        "lr_multipliers": files.plain_data(dict(optim.lr_multipliers or {})),
        "clip_grad_norm": optim.clip_grad_norm,
        "per_example": bool(optim.per_example),
        "elbo": loss.elbo,
        "estimator": loss.estimator,
        "num_particles": int(loss.num_particles),
        "kl_weight": _named(loss.kl_weight),
        "accumulate": int(engine.accumulate),
        "seed": seed,
        "order": files.plain_data(order),
    }
    identity = {"data": data_print, "settings": settings}
    if model_print is not None:
        identity["model"] = files.plain_data(model_print)
    return identity


def _check_complete(path, saved: Mapping, now: Mapping, version: int) -> None:
    """Refuse an identity that lacks an entry its format's files all have: a checkpoint of
    format 3 on records the data and every setting, of format 4 on the model too (a missing
    one would be a check switched off)."""
    if version < files.CHECKSUMMED:
        return
    if not isinstance(saved, Mapping) or not isinstance(saved.get("settings"), Mapping):
        missing = ["settings"]
    else:
        missing = [f"settings.{k}" for k in now["settings"] if k not in saved["settings"]]
    wanted = ("data", "model") if version >= MODEL_IDENTITY else ("data",)
    missing += [
        key
        for key in wanted
        if not isinstance(saved, Mapping) or not isinstance(saved.get(key), Mapping)
    ]  # present and a record: a None there would switch the comparison off
    data = saved.get("data") if isinstance(saved, Mapping) else None
    if isinstance(data, Mapping):
        missing += [f"data.{k}" for k in now["data"] if k not in data]
    if missing:
        raise ValueError(
            f"resume={str(path)!r} has an identity without {', '.join(missing)}, which every "
            f"checkpoint of format {version} records: the file was changed; start the fit "
            "again or use another checkpoint"
        )


#: The first format whose checkpoints record the model in their identity.
MODEL_IDENTITY = 4


def _rate_setting(length) -> float | str:
    """The identity's ``lr``: the rate given, or how the fit chose it."""
    measure = getattr(length, "measure", None)
    if measure is None:
        return float(length.lr)
    return "auto" if measure == "required" else "default"


def _named(value):
    return "callable" if callable(value) else value


def check_identity(path, saved: Mapping | None, now: Mapping, version: int = 2) -> None:
    """Refuse to resume the checkpoint at ``path`` (identity ``saved``; ``None`` for a
    checkpoint written before identities were recorded, which is not checked; a file of format
    ``version`` 3 or later always has one) as a fit whose identity is ``now``: a ``ValueError``
    naming every difference."""
    if saved is None:
        if version >= files.CHECKSUMMED:
            raise ValueError(
                f"resume={str(path)!r} has no identity (the data and settings it was made with), "
                f"which every checkpoint of format {version} records: the file was changed; "
                "start the fit again or use another checkpoint"
            )
        return
    _check_complete(path, saved, now, version)
    differ = []
    old, new = saved.get("settings", {}), now["settings"]
    for key in new:
        if key in old and old[key] != new[key]:
            differ.append(f"{key}={old[key]!r} in the checkpoint, {new[key]!r} now")
    model_old, model_new = saved.get("model"), now.get("model")
    if model_old is not None and model_new is not None and model_old != model_new:
        parts = sorted(k for k in {*model_old, *model_new} if model_old.get(k) != model_new.get(k))
        differ.append(f"the model differs (its {', '.join(parts)})")
    data_old, data_new = saved.get("data"), now["data"]
    if data_old is not None and data_old != data_new:
        what = (
            f"{data_old['size']} examples in the checkpoint, {data_new['size']} now"
            if data_old.get("size") != data_new.get("size")
            else "the same size, other values or shapes"
        )
        differ.append(f"the data differ ({what})")
    if differ:
        raise ValueError(
            f"resume={str(path)!r} was written by a fit with other settings: "
            + "; ".join(differ)
            + ". A resumed fit continues the same fit: pass the same data and settings to "
            "resume it (only num_steps, epochs, progress, callbacks, checkpoint_every, threads "
            "and jit may change; a new seed is a new fit), or drop resume= to start a new fit"
        )
