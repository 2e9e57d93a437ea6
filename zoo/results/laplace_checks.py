"""What a Laplace file must hold before laplace-torch sees it (:func:`check_laplace_payload`):
laplace-torch takes a state as it is and fails later with its own index errors, or ends the
process when it decomposes a non-finite curvature, so every entry is checked here against the
model, each failure a ``ValueError`` naming the file and the entry; and the state as plain
data for the file (:func:`plain`, :func:`tensors`)."""

from __future__ import annotations

import math

import torch

from zoo.arguments import is_int, is_number
from zoo.results.laplace_torch import LaplaceOptions
from zoo.storage import checks as file_checks

__all__ = ["check_laplace_payload", "check_options_entry", "covered_size"]


def check_options_entry(options, path) -> LaplaceOptions:
    """The file's ``options`` as :class:`LaplaceOptions`, refused unless a mapping of its fields
    with values it takes."""
    if not isinstance(options, dict):
        raise ValueError(f"{path}: the options entry is not a mapping of LaplaceOptions' fields")
    try:
        return LaplaceOptions.of(options)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{path}: the options entry: {err}") from None


def covered_size(model, options: LaplaceOptions, state: dict, info: dict, path) -> int:
    """How many weights the file's Gaussian covers: the last layer's, all the network's sites
    (a learned noise aside), or the subnetwork's indices (checked: integers, unique, in range)."""
    sites = {n: s for n, s in model.site_shapes.items() if n != "noise"}
    total = sum(math.prod(s) for s in sites.values())
    if options.weights == "all":
        return total
    if options.weights == "subnetwork":
        indices = info.get("subnetwork_indices")
        if not isinstance(indices, list) or not all(is_int(i) for i in indices):
            raise ValueError(f"{path}: info['subnetwork_indices'] is not a list of integers")
        if len(set(indices)) != len(indices) or not all(0 <= i < total for i in indices):
            raise ValueError(
                f"{path}: info['subnetwork_indices'] must be unique positions in [0, {total}) "
                "(the network's weights)"
            )
        if not indices:
            raise ValueError(f"{path}: info['subnetwork_indices'] is empty")
        return len(indices)
    name = state.get("_last_layer_name")
    if name is None:  # laplace-torch found it by a forward pass: the network's last linear layer
        linear = [n for n, m in model.net.named_modules() if isinstance(m, torch.nn.Linear)]
        name = linear[-1] if linear else None
    layer = [n for n in sites if isinstance(name, str) and n.rsplit(".", 1)[0] == name]
    if not layer:
        raise ValueError(
            f"{path}: state['_last_layer_name'] is {name!r}, which names no layer of the "
            f"model's sites {sorted(sites)}"
        )
    return sum(math.prod(sites[n]) for n in layer)


def check_laplace_payload(payload: dict, path, model, options: LaplaceOptions) -> None:
    """Refuse a Laplace file whose MAP weights are not the model's sites, whose curvature is
    not of the structure and size ``options`` say or not finite, or whose precisions, noise or
    counts are out of range, before laplace-torch is given any of it."""
    weights, state, info = payload["map_weights"], payload["state"], payload["info"]
    file_checks.check_tensors(weights, path, "map_weights")
    shapes = dict(model.site_shapes)
    wrong = {
        k: tuple(v.shape) for k, v in weights.items() if tuple(shapes.get(k, ())) != tuple(v.shape)
    }
    if set(weights) != set(shapes) or wrong:
        raise ValueError(
            f"{path}: the MAP weights are not the model's sites (saved {sorted(weights)}, "
            f"model {sorted(shapes)}; shapes that differ {wrong})"
        )
    if not isinstance(state, dict) or not isinstance(info, dict):
        raise ValueError(f"{path}: the state or info entry is not a mapping")
    for key in ("mean", "H", "prior_precision", "n_data", "likelihood"):
        if key not in state:
            raise ValueError(f"{path}: the laplace-torch state has no {key!r}")
    _check_finite(state, path, "state")
    data = state.get("data")
    if data is not None and not (
        isinstance(data, (list, tuple)) and len(data) == 2
        and all(torch.is_tensor(t) and t.dim() >= 1 and len(t) >= 1 for t in data)
    ):  # fmt: skip
        raise ValueError(
            f"{path}: state['data'] is a {type(data).__name__}, not laplace-torch's (input, "
            "target) pair of tensors: the file was changed; use another copy"
        )
    if state["likelihood"] != model.likelihood.task:
        raise ValueError(
            f"{path}: state['likelihood'] is {state['likelihood']!r}, the model's is "
            f"{model.likelihood.task!r}"
        )
    if not is_int(state["n_data"]) or state["n_data"] < 1:
        raise ValueError(f"{path}: state['n_data'] is {state['n_data']!r}, not a count >= 1")
    for key in ("prior_precision", "sigma_noise", "temperature"):
        value = state.get(key)
        if value is None:
            continue
        if not (torch.is_tensor(value) or is_number(value)):
            raise ValueError(f"{path}: state[{key!r}] is a {type(value).__name__}, not a number")
        values = value.reshape(-1) if torch.is_tensor(value) else torch.tensor([float(value)])
        if values.numel() == 0 or not bool((values > 0).all()):
            raise ValueError(f"{path}: state[{key!r}] must be positive, got {value!r}")
    n = covered_size(model, options, state, info, path)
    # a subnetwork's mean is every weight of the network (laplace-torch's layout), its H the
    # chosen ones'
    means = sum(math.prod(s) for k, s in shapes.items() if k != "noise")
    means = means if options.weights == "subnetwork" else n
    mean = state["mean"]
    if not torch.is_tensor(mean) or tuple(mean.shape) != (means,):
        raise ValueError(
            f"{path}: state['mean'] has shape {tuple(getattr(mean, 'shape', ()))}, where the "
            f"approximation's mean has {means} weights"
        )
    _check_curvature(state["H"], options.hessian, n, path)


def _check_finite(value, path, entry: str) -> None:
    """Every tensor in ``value`` (nested dicts and lists) finite and floating where it is a
    float; raises naming the first that is not."""
    if torch.is_tensor(value):
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise ValueError(f"{path}: {entry} holds values that are not finite")
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_finite(item, path, f"{entry}[{key!r}]")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _check_finite(item, path, f"{entry}[{index}]")
    elif isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{path}: {entry} is {value}, not finite")


def _check_curvature(H, hessian: str, n: int, path) -> None:
    """``H`` of the structure ``hessian`` over ``n`` weights: a vector (diagonal), a symmetric
    ``n x n`` matrix (full), or per layer a list of square Kronecker factors whose sizes
    multiply to the layer's weights (Kronecker-factored)."""
    if hessian == "diag":
        ok = torch.is_tensor(H) and tuple(H.shape) == (n,) and bool((H >= 0).all())
        if not ok:
            raise ValueError(f"{path}: state['H'] is not a non-negative vector of {n} numbers")
        return
    if hessian == "full":
        if not torch.is_tensor(H) or tuple(H.shape) != (n, n):
            raise ValueError(f"{path}: state['H'] is not an {n} x {n} matrix")
        if not torch.allclose(H, H.T, rtol=1e-4, atol=1e-6 * float(H.abs().max().clamp_min(1))):
            raise ValueError(f"{path}: state['H'] is not symmetric")
        return
    blocks = H if isinstance(H, list) else None
    covered = 0
    for block in blocks or [None]:
        factors = block if isinstance(block, list) and block else None
        if factors is None or not all(
            torch.is_tensor(f) and f.dim() == 2 and f.shape[0] == f.shape[1] for f in factors
        ):
            raise ValueError(
                f"{path}: state['H'] is not per layer a list of square Kronecker factors"
            )
        covered += math.prod(int(f.shape[0]) for f in factors)
    if covered != n:
        raise ValueError(
            f"{path}: state['H']'s Kronecker factors cover {covered} weights, the approximation {n}"
        )


def tensors(value):
    """The tensors of a laplace-torch state entry (nested lists and tuples), one by one."""
    if torch.is_tensor(value):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from tensors(v)


def plain(value):
    """laplace-torch's state entry as plain data (its enums as their strings)."""
    if torch.is_tensor(value):
        return value.detach().cpu()
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, str):
        return str(value.value) if hasattr(value, "value") else str(value)
    return value
