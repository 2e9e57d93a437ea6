"""A guide as plain data, the saved form of every variational fit: what a file holds of it
(:func:`guide_payload`), the checks of that entry before anything is built
(:func:`check_guide_payload`), how the guide is rebuilt from it (:func:`build_guide`, with the
entries of earlier releases rewritten by :func:`upgraded`), and the site shapes that say whether
a model and a guide belong together (:func:`attach`). The file around it is
:mod:`zoo.storage.files`; the model's entry is :mod:`zoo.storage.model_form`."""

from __future__ import annotations

from collections import OrderedDict

import torch
from pyro import poutine
from pyro.poutine.util import site_is_subsample

import guides
from guides.site import SitePosterior, direct_parameters
from zoo.models.statistics import frozen_statistics
from zoo.storage.checks import MAX_ELEMENTS, check_state, check_tensors, count_elements
from zoo.storage.files import device_of

__all__ = [
    "attach",
    "build_guide",
    "check_guide_payload",
    "guide_payload",
    "model_signature",
    "site_signature",
    "upgraded",
]


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


def check_guide_payload(guide: dict, path) -> None:
    """Refuse a guide entry whose spec, example input, sites or state no fit writes, before
    any of it is built: declared sizes within :data:`MAX_ELEMENTS`, state tensors floating
    point and finite."""
    if not isinstance(guide, dict):
        raise ValueError(f"{path}: the guide entry is not a dict")
    missing = [k for k in ("spec", "input", "sites", "state") if k not in guide]
    if missing:
        raise ValueError(f"{path}: the guide entry has no {missing} (the file was cut or changed)")
    spec = guide["spec"]
    if not isinstance(spec, dict) or not isinstance(spec.get("family"), str):
        raise ValueError(f"{path}: the guide's spec {spec!r} names no family")
    inputs = guide["input"]
    if not isinstance(inputs, list) or not inputs:
        raise ValueError(f"{path}: the guide's example input {inputs!r} is not a list of shapes")
    for item in inputs:
        if not (isinstance(item, (list, tuple)) and len(item) == 2):
            raise ValueError(f"{path}: the guide's example input {item!r} is not [shape, dtype]")
        shape, dtype = item
        count_elements(shape, path, "the guide's example input")
        if not isinstance(getattr(torch, str(dtype), None), torch.dtype):
            raise ValueError(f"{path}: the guide's example input has no dtype {dtype!r}")
    if not isinstance(guide["sites"], dict):
        raise ValueError(f"{path}: the guide's sites entry is not a dict of shapes")
    total = sum(count_elements(s, path, f"site {n!r}") for n, s in guide["sites"].items())
    if total > MAX_ELEMENTS:
        raise ValueError(f"{path}: the guide's sites declare {total:.3g} weights in all")
    check_tensors(guide["state"], path, "guide state")


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
    check_state(guide.state_dict(), state, "the guide")
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


def site_signature(guide) -> dict[str, tuple[int, ...]]:
    """``{site: shape}`` of the guide's latent sites."""
    return {name: tuple(shape) for name, shape in guide.site_shapes().items()}


def model_signature(model, guide) -> dict[str, tuple[int, ...]]:
    """Shapes of the model's latent sites, traced on zeros shaped like the guide's example."""
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
