"""``zoo.laplace``: the Laplace approximation of a zoo model through laplace-torch, at MAP
weights it fits first, a fit's, or a converted network's (the result:
:class:`zoo.results.laplace_approximation.LaplaceFit`; the bridge:
:mod:`zoo.results.laplace_torch`)."""

from __future__ import annotations

import time
import warnings

import torch
from torch.utils.data import DataLoader, TensorDataset
from typing_extensions import Unpack

from zoo.arguments import check_positive
from zoo.baselines import producers
from zoo.baselines.prior_search import held_out_precision, held_out_split
from zoo.baselines.selection import subnetwork_indices
from zoo.data.checks import check_labelled_data
from zoo.data.forms import Data, gather_tensors
from zoo.models.base import BayesianModel
from zoo.results.laplace_approximation import LaplaceFit
from zoo.results.laplace_torch import (
    HELD_OUT_RULES,
    LaplaceOptions,
    build,
    check_laplace_model,
    import_laplace,
    laplace_torch_call,
)
from zoo.results.variational import FitResult
from zoo.runtime.serial import one_at_a_time
from zoo.training.fitting import fit
from zoo.training.keywords import HowToFit, fit_arguments, refuses_flat_keywords


@refuses_flat_keywords
@one_at_a_time
def laplace(
    model: BayesianModel,
    data: Data,
    *,
    at: FitResult | str | None = None,
    options: LaplaceOptions | dict | None = None,
    validation: Data | None = None,
    progress: bool = True,
    **how: Unpack[HowToFit],
) -> LaplaceFit:
    """The Laplace approximation of ``model``'s posterior on ``data`` through laplace-torch.

    Parameters
    ----------
    model
        A zoo model built on a plain network (``zoo.models.*``, ``zoo.models.from_module``);
        its likelihood decides laplace-torch's (classification, or regression with one noise
        level: fixed, or the MAP fit's learned ``noise``).
    data
        Training data (``(X, y)``, a Dataset or a DataLoader), held in memory.
    at : FitResult or "module", optional
        Where the Gaussian is centred: by default a ``zoo.fit(model, "map", data,
        **fit_options)`` is run first; a ``FitResult`` gives its guide's median (a point mass's
        weights; a variational fit's means); ``"module"`` takes the weights of ``model.net`` as
        they are (a network trained outside the library and converted).
    options : LaplaceOptions or dict, optional
        Which weights, the Hessian's structure, the prior precision, the predictive.
    validation : data, optional
        Held-out data (``(X, y)``, a Dataset or a DataLoader; not the test data), read by
        ``prior_precision="auto"`` (the default) and ``"gridsearch"`` (which needs them): the
        precision whose predictive scores the lowest NLL on them
        (:mod:`zoo.baselines.prior_search`; its grid and scores are in
        ``info["prior_search"]``). Checked against the model before any fit. Without them,
        ``"auto"`` holds a random tenth of ``data`` out (drawn from the fit's ``seed``; the
        marginal likelihood where that tenth would be under 20 rows): with ``at=None`` the MAP
        fit and the curvature see the other nine tenths; at given weights (``"module"``, a
        ``FitResult``) the curvature sees all of ``data``, and where those weights were trained
        on the held rows the choice leans to the network's own predictive.
        ``info["prior_rule"]`` says which rule ran on which rows.
    progress : bool, default True
        The MAP fit's progress bar (unless ``run`` is given: then its ``progress``).
    **how : HowToFit
        The MAP fit's :func:`zoo.fit` arguments (:class:`zoo.training.keywords.HowToFit`);
        ``batch_size`` (default 128) is also that of laplace-torch's pass over the data.

    Notes
    -----
    Everything laplace-torch cannot do with the model, and a missing laplace-torch, is refused
    before any fit.
    """
    fit_args = fit_arguments(progress, how, "laplace")
    options = LaplaceOptions.of(options)
    check_laplace_model(model, options)
    batch_size = how.get("batch_size") or 128
    check_positive(batch_size=batch_size)
    if not (at is None or at == "module" or isinstance(at, FitResult)):
        raise TypeError(f"at must be None, a FitResult or 'module', got {at!r}")
    held_out = validation_tensors(model, options, validation)
    import_laplace()
    start = time.perf_counter()
    data, held_out, rule = prior_rule(model, data, at, options, held_out, how.get("seed"))
    info: dict = {"prior_rule": rule}
    weights, loader, map_fit = map_point(model, data, at, fit_args, batch_size)
    if map_fit is not None:  # how the MAP weights were fitted, here or before
        info["map_fit"] = map_fit.fitting()
        if at is None:  # the steps this call took, its rate test's included
            info["map_steps"] = info["map_fit"]["steps"]
    net_weights, noise = split_noise(weights)
    indices = None
    if options.weights == "subnetwork":
        indices = subnetwork_indices(model, net_weights, options, loader, noise)
        info["subnetwork_indices"] = indices.tolist()
    la = build(model, net_weights, options, indices=indices)
    if noise is not None:
        la.sigma_noise = noise
    with laplace_torch_call("zoo.laplace's fit"):
        la.fit(loader)
    if held_out is None and options.prior_precision in ("marglik", "auto"):
        pred_type = "nn" if options.predictive == "nn" else "glm"
        with laplace_torch_call("zoo.laplace's prior precision"), warnings.catch_warnings():
            # laplace-torch's note on link_approx, which the marginal likelihood does not use
            warnings.filterwarnings("ignore", "By default `link_approx`", UserWarning)
            la.optimize_prior_precision(pred_type=pred_type, method="marglik")
    result: LaplaceFit = LaplaceFit(model, la, options, weights, 0.0, info)
    if held_out is not None:
        x, y = (t.to(result.device) for t in held_out)
        search_options = result.predict_options(None, seed=0, progress=False)
        warn_top = options.prior_precision == "gridsearch"
        info["prior_search"] = held_out_precision(result, x, y, search_options, warn_top)
    info["prior_precision"] = la.prior_precision.detach().reshape(-1).tolist()
    result.wall_time = time.perf_counter() - start
    return result


def prior_rule(model, data, at, options: LaplaceOptions, held_out, seed):
    """``(data, held_out, rule)``: the rows the fit and the curvature see, the held-out
    ``(x, y)`` the grid search scores (``None`` for the other rules), and what ran on which
    rows, in words (``info["prior_rule"]``). ``"auto"`` without ``validation`` splits ``data``
    (:func:`held_out_split`); everything else passes through."""
    rule = options.prior_precision
    if rule != "auto":
        named = "fixed" if not isinstance(rule, str) else rule
        return data, held_out, named + (" (on validation)" if held_out is not None else "")
    if held_out is not None:
        return data, held_out, "gridsearch (on validation)"
    x, y = gather_tensors(data)
    split = held_out_split(len(x), seed)
    if split is None:
        return data, None, f"marglik ({len(x)} rows are too few to hold a tenth out)"
    kept, held = split
    where = "held out of the MAP fit" if at is None else "of the data, at the given weights"
    rule = f"gridsearch (on {len(held)} rows {where})"
    return ((x[kept], y[kept]) if at is None else (x, y)), (x[held], y[held]), rule


def check_pairing(rule: str | float, has_validation: bool, where: str) -> None:
    """Refuse held-out data with neither ``prior_precision="gridsearch"`` nor ``"auto"``, and
    the grid search without held-out data; ``where`` names the call in the message
    (``"zoo.laplace"``, a ``zoo.compare`` row)."""
    if rule == "gridsearch" and not has_validation:
        raise ValueError(
            f"{where}: prior_precision='gridsearch' chooses the precision on held-out data: "
            "pass validation=(X_val, y_val), data the MAP fit does not see (not the test data)"
        )
    if rule not in HELD_OUT_RULES and has_validation:
        raise ValueError(
            f"{where}: validation data are read only by prior_precision='auto' or "
            f"'gridsearch' (options give {rule!r}); pass options={{'prior_precision': "
            "'auto'}} or leave validation out"
        )


def validation_tensors(model, options: LaplaceOptions, validation) -> tuple | None:
    """``(x, y)`` of the held-out data (``prior_precision="auto"`` or ``"gridsearch"``),
    checked against the model (on the device its network is on, before any fit), or ``None``
    without them; refused where the rule and the data do not go together (:func:`check_pairing`)."""
    check_pairing(options.prior_precision, validation is not None, "zoo.laplace")
    if validation is None:
        return None
    x, y = gather_tensors(validation)
    check_labelled_data(model, x, y, next(model.net.parameters()).device)  # where it is now
    return x, y


def split_noise(weights: dict) -> tuple[dict, torch.Tensor | None]:
    """``(network weights, noise)``: the sites of the network, and a learned noise's standard
    deviation as a 0-d tensor (``None`` without one), as laplace-torch takes them apart."""
    net_weights = {k: v for k, v in weights.items() if k != "noise"}
    return net_weights, weights["noise"].reshape(()) if "noise" in weights else None


def map_point(model, data, at, fit_args: dict, batch_size: int):
    """``(weights, loader, map_fit)``: the MAP weights of every site from ``at``
    (``None``: a MAP fit run here with ``fit_args``; a ``FitResult``; ``"module"``), the data
    checked against the model and in a laplace-torch loader, and the MAP fit run here or
    given (``None`` at a module's weights)."""
    x, y = gather_tensors(data)
    map_fit = None
    if at == "module":
        weights = model.net_means()
    else:
        if at is None:
            at = fit(model, "map", data, **fit_args)
        map_fit = at
        weights = {k: v.detach() for k, v in at.guide.median().items()}
    device = next(iter(weights.values())).device
    check_labelled_data(model, x, y, device)
    if model.likelihood.task == "regression":
        y = y.reshape(len(y), -1)  # laplace-torch's regression targets are (N, outputs)
    rows = TensorDataset(x.to(device), y.to(device))
    # a generator of its own: each pass's iterator draws a seed from it, not the global one
    loader = DataLoader(rows, batch_size=batch_size, generator=torch.Generator())
    return weights, loader, map_fit


#: What a ``"laplace"`` row of :func:`zoo.compare` takes beside :class:`LaplaceOptions`' fields:
#: :func:`laplace`'s ``at`` and ``validation``.
LAPLACE_CALL = ("at", "validation")


def _check_row(options: dict) -> None:
    at = options.get("at")
    if at not in (None, "module"):
        raise ValueError(f"'at' is 'module' (post-hoc, no MAP fit) or left out, got {at!r}")
    fields = LaplaceOptions.of({k: v for k, v in options.items() if k not in LAPLACE_CALL})
    check_pairing(fields.prior_precision, options.get("validation") is not None,
                  "a zoo.compare 'laplace' row")  # fmt: skip


def _make_row(model_factory, family, options, train, args, progress) -> LaplaceFit:
    options = dict(options)
    at = options.pop("at", None)  # "module": post-hoc at a trained network's weights
    validation = options.pop("validation", None)  # gridsearch's held-out data
    return laplace(model_factory(), train, at=at, options=options, validation=validation,
                   progress=progress, **args)  # fmt: skip


producers.register("laplace", _check_row, _make_row)
