"""A guide and a model as plain data: what a saved fit holds of each (:func:`guide_payload`,
:func:`model_payload`), how each is rebuilt from it (:func:`build_guide`,
:func:`restore_model`), and the site shapes that say whether a model and a guide belong
together. The file around them is :mod:`zoo.storage.files`."""

from __future__ import annotations

from collections import OrderedDict

import torch

import guides
from guides.site import SitePosterior, direct_parameters
from zoo.models.statistics import frozen_statistics
from zoo.storage import checks as file_checks
from zoo.storage.files import device_of


def guide_payload(guide) -> dict:
    """The guide as plain data: spec, example input, site shapes and state dict."""
    if not hasattr(guide, "spec"):
        raise TypeError(
            f"{type(guide).__name__} cannot be saved as plain data; use a guides family "
            "(guides.available()) or guides.AutoMixed"
        )
    guide._require_setup()
    args = guide.prototype_trace.nodes["_INPUT"]["args"]
    return {
        "spec": guide.spec(),
        "input": [[list(a.shape), str(a.dtype).removeprefix("torch.")] for a in args],
        "sites": {name: list(shape) for name, shape in guide.site_shapes().items()},
        "state": guide.state_dict(),  # keeps each module's version (_metadata)
    }


def build_guide(model, payload: dict):
    """A guide of ``model`` rebuilt from :func:`guide_payload`, on the CPU: the registry builds
    it from its spec, one call on zeros of the example input's shape creates its parameters
    (the global RNG state is left as it was), and the saved values are loaded."""
    guide = guides.build(model, payload["spec"])
    device = device_of(model)
    example = [
        torch.zeros(shape, dtype=getattr(torch, dtype), device=device)
        for shape, dtype in payload["input"]
    ]
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad(), direct_parameters():
            with frozen_statistics():
                guide(*example)
    except (RuntimeError, ValueError) as err:
        raise ValueError(
            "the saved guide was fitted to a different model: this model cannot take the "
            f"guide's example input of shape {tuple(payload['input'][0][0])} ({err})"
        ) from None
    found = {name: list(shape) for name, shape in guide.site_shapes().items()}
    if found != payload["sites"]:
        raise ValueError(_sites_differ(payload["sites"], found))
    state = upgraded(guide, payload["state"])
    file_checks.check_state(guide.state_dict(), state, "the guide")
    guide.load_state_dict(state)
    return guide


def upgraded(guide, state: dict) -> dict:
    """``state`` (a saved guide's) with the entries an earlier release wrote in another
    parameterisation rewritten by the sites that own them
    (:meth:`guides.site.SitePosterior.upgrade_state`); a copy, the payload is left alone, with
    the modules' versions (``_metadata``) that their own loading reads."""
    metadata = getattr(state, "_metadata", None)
    state = OrderedDict(state)
    if metadata is not None:
        state._metadata = metadata  # type: ignore[attr-defined]
    for name, module in guide.named_modules():
        if isinstance(module, SitePosterior):
            module.upgrade_state(state, f"{name}." if name else "")
    return state


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
    return {"spec": spec, "state": state, "class": type(model).__name__}


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
    if model is None:
        if payload["spec"] is None:
            raise ValueError(
                f"this fit's model ({payload.get('class')}) is not a zoo.models class, so it "
                "cannot be rebuilt from plain data: pass the model again, "
                "zoo.load(path, model=...)"
            )
        from zoo.models import build

        model = build(payload["spec"])
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


def site_signature(guide) -> dict[str, tuple[int, ...]]:
    """``{site: shape}`` of the guide's latent sites."""
    return {name: tuple(shape) for name, shape in guide.site_shapes().items()}


def model_signature(model, guide) -> dict[str, tuple[int, ...]]:
    """Shapes of the model's latent sites, traced on zeros shaped like the guide's example."""
    from pyro import poutine
    from pyro.poutine.util import site_is_subsample

    args = guide.prototype_trace.nodes["_INPUT"]["args"]
    device = device_of(model)
    args = tuple(torch.zeros_like(a, device=device) if torch.is_tensor(a) else a for a in args)
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]), frozen_statistics():
            trace = poutine.block(poutine.trace(model).get_trace)(*args)
    except (RuntimeError, ValueError) as err:
        raise ValueError(
            f"the saved guide was fitted to a different model: this model cannot take the "
            f"guide's example input ({err})"
        ) from None
    return {
        name: tuple(site["value"].shape)
        for name, site in trace.iter_stochastic_nodes()
        if not site_is_subsample(site) and not site["is_observed"]
    }


def attach(guide, model) -> None:
    """Attach a guide to ``model``, checking that the two have the same sites."""
    expected = site_signature(guide)
    found = model_signature(model, guide)
    if expected != found:
        raise ValueError(_sites_differ(expected, found))
    guide._model = (model,)


def _sites_differ(expected: dict, found: dict) -> str:
    missing = sorted(set(expected) - set(found))
    extra = sorted(set(found) - set(expected))
    shapes = sorted(
        f"{n}: {tuple(expected[n])} vs {tuple(found[n])}"
        for n in set(expected) & set(found)
        if tuple(expected[n]) != tuple(found[n])
    )
    parts = (
        f"sites missing from this model {missing}" if missing else "",
        f"sites the guide does not know {extra}" if extra else "",
        f"shapes differ ({', '.join(shapes)})" if shapes else "",
    )
    return "the saved guide was fitted to a different model: " + "; ".join(p for p in parts if p)
