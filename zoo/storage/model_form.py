"""A model as plain data, the saved form every kind of posterior holds of its model: what a file
holds of it (:func:`model_payload`: its spec, the network's fitted state and the training inputs
of each draw's batch norm statistics, :mod:`zoo.models.per_draw`), how it is
restored (:func:`restore_model`, the state checked before the model holds any of it) and the
fingerprint a checkpoint's identity records (:func:`model_fingerprint`). The guide's entry is
:mod:`zoo.storage.guide_form`."""

from __future__ import annotations

import torch

from zoo.models import build
from zoo.models.per_draw import check_kept_inputs
from zoo.storage import checks as file_checks

__all__ = [
    "kept_inputs",
    "model_fingerprint",
    "model_payload",
    "restore_model",
    "without_kept_inputs",
]


def model_payload(model) -> dict:
    """The model as plain data: its spec (``None`` for a user's network) and its state (the
    network's deterministic parameters and buffers, batch norm's running statistics among
    them, a learned prior's scales, ...), less the network's weights that are sample sites
    (placeholders the model never uses)."""
    if not isinstance(model, torch.nn.Module):
        return {"spec": None, "state": {}}
    frozen = {f"net.{n}" for n in getattr(model, "site_shapes", {})}
    state = model.state_dict()
    for key in frozen:
        state.pop(key, None)
    spec_of = getattr(model, "spec", None)
    spec = spec_of() if spec_of is not None else None
    payload = {"spec": spec, "state": state, "class": type(model).__name__}
    inputs = getattr(model, "statistics_inputs", None)
    if inputs is not None:  # training inputs of each draw's batch norm statistics
        payload["statistics_inputs"] = inputs
    return payload


def model_fingerprint(model) -> dict:
    """What defines ``model``, as plain data for a checkpoint's identity (a resume with
    another model is refused): its class, its sites' shapes, the network's structure (a digest
    of its ``repr``: the layers, their activations, batch norm's ``momentum`` and ``eps``), the
    prior (its spec, or its class and a digest of its fixed numbers, the buffers) and the
    likelihood's spec. Code inside a ``forward`` is not seen."""
    fingerprint: dict = {"class": type(model).__name__}
    net = getattr(model, "net", None)
    if isinstance(net, torch.nn.Module):
        fingerprint["network"] = file_checks.digest(repr(net))[:16]
    shapes = getattr(model, "site_shapes", None)
    if shapes is not None:
        fingerprint["sites"] = {name: list(shape) for name, shape in shapes.items()}
    prior = getattr(model, "prior", None)
    if isinstance(prior, torch.nn.Module):
        spec_of = getattr(prior, "spec", None)
        spec = spec_of() if callable(spec_of) else None
        buffers = {n: b.detach().cpu() for n, b in prior.named_buffers()}
        fingerprint["prior"] = spec or {
            "class": type(prior).__name__,
            "buffers": file_checks.digest(buffers)[:16],
        }
    likelihood_spec = getattr(getattr(model, "likelihood", None), "spec", None)
    if callable(likelihood_spec):
        fingerprint["likelihood"] = likelihood_spec()
    return fingerprint


def restore_model(payload: dict, model=None):
    """The saved model, or ``model`` (checked against the saved sites by the caller), with the
    saved state loaded."""
    if not isinstance(payload, dict) or not isinstance(payload.get("state"), dict) or (
        "spec" not in payload
    ):  # fmt: skip
        got = sorted(payload) if isinstance(payload, dict) else type(payload).__name__
        raise ValueError(
            f"the model entry holds {got}, not a model's spec and state (a dict): the file "
            "was changed; use another copy"
        )
    if model is None:
        if payload["spec"] is None:
            raise ValueError(
                f"this fit's model ({payload.get('class')}) is not a zoo.models class, so it "
                "cannot be rebuilt from plain data: pass the model again, "
                "zoo.load(path, model=...)"
            )
        model = build(payload["spec"])
    inputs = payload.get("statistics_inputs")
    if inputs is not None:  # checked, like the state, before the model holds any of it
        if not hasattr(model, "statistics_inputs"):
            raise ValueError(
                f"the saved fit keeps training inputs for batch norm's per-draw statistics, "
                f"which a {type(model).__name__} cannot hold: pass a zoo model"
            )
        check_kept_inputs(inputs, "the saved model")
    if isinstance(model, torch.nn.Module) and payload["state"]:
        _check_network_state(payload["state"], model)  # before the model holds any of it
        try:
            missing, unexpected = model.load_state_dict(payload["state"], strict=False)
        except RuntimeError as err:  # a shape that differs
            raise ValueError(
                f"the saved model state does not fit the model: {str(err).splitlines()[-1]}"
            ) from None
        if unexpected:
            raise ValueError(f"the model has no entries {sorted(unexpected)} of the saved state")
    if inputs is not None:
        check_kept_inputs(inputs, "the saved model", model)  # the network takes them
        device = next((b.device for b in model.buffers()), inputs.device)
        model.statistics_inputs = inputs.to(device)
    return model


def _check_network_state(state: dict, model) -> None:
    """Refuse a saved model state that lacks the network's fitted state (deterministic
    parameters, running statistics) or holds values that are not finite there."""
    needed = [*getattr(model, "deterministic", ()), *getattr(model, "_statistics", ())]
    keys = [f"net.{n}" for n in needed]
    missing = sorted(k for k in keys if k not in state)
    if missing:
        raise ValueError(
            f"the saved model state lacks the network's fitted entries {missing} (deterministic "
            "parameters, running statistics): the file was changed or saved for another model"
        )
    file_checks.check_tensors({k: state[k] for k in keys}, "the saved model", "state", False)
    statistics = [f"net.{n}" for n in getattr(model, "_statistics", ())]
    file_checks.check_statistics({k: state[k] for k in statistics}, "the saved model", "state")


def kept_inputs(payload, where: str = "file"):
    """``(where, tensor)`` for each model entry's ``statistics_inputs`` (the training inputs
    of batch norm's per-draw statistics) in a posterior's ``payload``, ``where`` its key
    path."""
    if isinstance(payload, dict):
        for key, item in payload.items():
            if key == "statistics_inputs" and torch.is_tensor(item):
                yield f"{where}[{key!r}]", item
            else:
                yield from kept_inputs(item, f"{where}[{key!r}]")
    elif isinstance(payload, list):
        for k, item in enumerate(payload):
            yield from kept_inputs(item, f"{where}[{k}]")


def without_kept_inputs(payload):
    """``payload`` with every model entry's ``statistics_inputs`` left out (copied where
    changed)."""
    if isinstance(payload, dict):
        return {k: without_kept_inputs(v) for k, v in payload.items() if k != "statistics_inputs"}
    if isinstance(payload, list):
        return [without_kept_inputs(v) for v in payload]
    return payload
