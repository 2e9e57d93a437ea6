"""The Laplace approximation through laplace-torch (``pip install "bnn-zoo[laplace]"``).

A local Gaussian at the MAP weights ``w*``: ``q(w) = N(w*, (H + P)^-1)``, ``H`` the Hessian of
the negative log likelihood of the training data at ``w*`` in laplace-torch's approximation
(generalised Gauss-Newton: Kronecker-factored, diagonal or full), ``P`` the prior precision,
by default fitted by maximising the marginal likelihood (the evidence) after the fact.
laplace-torch does the curvature and the predictive; this module only gives it a zoo model's
network at its MAP weights and turns its predictive samples into the library's ``Prediction``
objects, so every metric, plot, ``compare`` row and ``agreement`` distance works on it.

The MAP weights come from a ``zoo.fit`` of the model with the point-mass family (``"map"``:
``-log p(D | w) - log p(w)`` under the model's own prior, so the Laplace posterior is the
model's), from a fit given, or from the model's network as it is (a trained network converted
with :func:`zoo.models.from_module`).
"""

from __future__ import annotations

import contextlib
import copy
import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.func import functional_call, jvp

from zoo.arguments import is_int, is_number
from zoo.runtime.packages import require_torchvision

#: The weights laplace-torch approximates, the Hessian structures and predictives it offers
#: here (laplace-torch's names).
WEIGHTS = ("last_layer", "all", "subnetwork")
#: How a subnetwork's weights are chosen: Daxberger et al.'s rule (the largest marginal
#: variances of a diagonal Laplace at the MAP), or the largest MAP magnitudes (a baseline).
SUBNETWORK_RULES = ("variance", "magnitude")
HESSIANS = ("kron", "diag", "full")
#: How the prior precision is chosen when it is not a number: the training data's marginal
#: likelihood, or the held-out NLL of the fit's predictive (validation data given).
PRIOR_RULES = ("auto", "marglik", "gridsearch")
#: The rules that read held-out data (``validation=``, or a split ``"auto"`` holds out).
HELD_OUT_RULES = ("auto", "gridsearch")
PREDICTIVES = ("glm", "nn", "probit")
#: A full Hessian of more weights than this is refused: it is a dense ``n x n`` matrix.
FULL_HESSIAN_MAX = 20_000


@dataclass(frozen=True)
class LaplaceOptions:
    """laplace-torch's choices, checked when the group is built.

    Parameters
    ----------
    weights : {"last_layer", "all", "subnetwork"}, default "last_layer"
        Which weights get the Gaussian; the others stay at their MAP values. ``"subnetwork"``
        (needs ``hessian="full"``): ``subnetwork_size`` weights from any layer, chosen by
        ``subnetwork_select``.
    hessian : {"kron", "diag", "full"}, default "kron"
        The curvature's structure: Kronecker-factored per layer (KFAC), diagonal, or dense
        (refused above ``FULL_HESSIAN_MAX`` weights).
    prior_precision : "auto", "marglik", "gridsearch" or float, default "auto"
        ``P``. ``"auto"``: the grid search on ``validation=`` when given, otherwise on a split
        that ``zoo.laplace`` holds out of ``data`` itself
        (:func:`zoo.baselines.prior_search.held_out_split`), or the marginal likelihood where
        ``data`` are too few to split. ``"marglik"``: fitted by maximising the marginal
        likelihood of the training data (laplace-torch's recommended recipe; where the MAP
        network interpolates its training data, the evidence favours a prior too broad and the
        predictive under-fits). ``"gridsearch"``: the precision whose predictive scores the
        lowest NLL on ``validation=`` (needed; :mod:`zoo.baselines.prior_search`). A number: a
        fixed precision (``1 / sigma^2`` of an isotropic ``N(0, sigma^2)``).
    predictive : {"glm", "nn", "probit"}, default "glm"
        How predictions are made: function-space samples of the linearised network (the GLM
        predictive, consistent with the curvature), sampled networks (``"nn"``), or, for
        classification, the probit approximation of the GLM predictive in closed form (one
        deterministic probability vector per input: a ``Prediction`` of one "network").
    subnetwork_size : int, default 1000
        The weights of a ``"subnetwork"`` approximation (at most ``FULL_HESSIAN_MAX``).
    subnetwork_select : {"variance", "magnitude"}, default "variance"
        ``"variance"``, Daxberger et al.'s rule (ICML 2021): the weights of largest marginal
        variance under a diagonal Laplace of every weight at the MAP (laplace-torch's
        ``LargestVarianceDiagLaplaceSubnetMask``; its prior precision is the fixed
        ``prior_precision``, or otherwise fitted to the diagonal Laplace's marginal likelihood
        first). ``"magnitude"``: the largest ``|MAP weight|``, a cheaper baseline
        that is not the paper's.
    """

    weights: str = "last_layer"
    hessian: str = "kron"
    prior_precision: str | float = "auto"
    predictive: str = "glm"
    subnetwork_size: int = 1000
    subnetwork_select: str = "variance"

    @classmethod
    def of(cls, options: LaplaceOptions | dict | None) -> LaplaceOptions:
        """``options`` as the group: ``None`` for the defaults, a mapping of its fields (an
        unknown key refused, naming the fields), or the group itself."""
        if options is None:
            return cls()
        if isinstance(options, cls):
            return options
        if not isinstance(options, Mapping):
            raise TypeError(
                f"options must be a zoo.LaplaceOptions or a dict of its fields, got {options!r}"
            )
        unknown = set(options) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(
                f"LaplaceOptions takes the options {sorted(cls.__dataclass_fields__)}, got "
                f"{sorted(options)}"
            )
        return cls(**options)

    def __post_init__(self):
        for name, allowed in (
            ("weights", WEIGHTS),
            ("hessian", HESSIANS),
            ("predictive", PREDICTIVES),
            ("subnetwork_select", SUBNETWORK_RULES),
        ):
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"LaplaceOptions({name}={value!r}): choose one of {allowed}")
        size = self.subnetwork_size
        if not is_int(size) or not 1 <= size <= FULL_HESSIAN_MAX:
            raise ValueError(
                f"LaplaceOptions(subnetwork_size={size!r}): an int from 1 to {FULL_HESSIAN_MAX:,} "
                "(its Hessian is dense)"
            )
        if self.weights == "subnetwork" and self.hessian != "full":
            raise ValueError(
                f"LaplaceOptions(weights='subnetwork', hessian={self.hessian!r}): laplace-torch's "
                "subnetwork Laplace takes hessian='full' only"
            )
        p = self.prior_precision
        if p not in PRIOR_RULES:
            if isinstance(p, str) or not is_number(p) or not p > 0:
                raise ValueError(
                    f"LaplaceOptions(prior_precision={p!r}): 'auto' (chosen on held-out data), "
                    "'marglik' (fitted by marginal likelihood), 'gridsearch' (chosen on "
                    "validation data) or a positive number"
                )


@contextlib.contextmanager
def dependency_notices_off():
    """Silence notices about laplace-torch's and its dependencies' code, not the user's:
    torch's deprecation of ``torch.jit.script`` (called on import, and by torch's own
    forward-mode decompositions that their curvature products load) and of the non-full
    backward hooks that ASDL registers for the diagonal curvature, and laplace-torch's own
    note on ASDL's Jacobians."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*torch.jit.script.*", FutureWarning)
        warnings.filterwarnings("ignore", "Using a non-full backward hook", FutureWarning)
        # laplace-torch's note that the GLM predictive of an ASDL (diagonal) fit forms its
        # Jacobians with torch.func instead: what LaplaceFit.predict's small blocks allow for
        warnings.filterwarnings("ignore", "ASDL backend is used", UserWarning)
        yield


class LaplaceTorchError(RuntimeError):
    """laplace-torch failed in a way it reports by ending the process (``exit()``)."""


@contextlib.contextmanager
def laplace_torch_call(what: str):
    """A call into laplace-torch (``what`` says which fit or file) with its dependencies'
    notices off (:func:`dependency_notices_off`) and its ``exit()`` turned into a
    :class:`LaplaceTorchError`: laplace-torch ends the process (status 0, no message) when the
    eigendecomposition of a Kronecker factor fails twice, which a non-finite or badly
    conditioned curvature causes."""
    try:
        with dependency_notices_off():
            yield
    except torch.linalg.LinAlgError as err:
        first = str(err).strip().splitlines()[0]
        raise LaplaceTorchError(
            f"{what}: laplace-torch's linear algebra failed ({first}): the posterior precision "
            "is not positive definite (a non-finite or badly conditioned curvature). Refit the "
            "MAP weights, or use hessian='diag' or a larger prior precision"
        ) from err
    except SystemExit:
        raise LaplaceTorchError(
            f"{what}: laplace-torch could not decompose the curvature (it tried to end the "
            "process): the Hessian has non-finite or badly conditioned entries. Refit the MAP "
            "weights (a longer fit, a smaller learning rate), or use hessian='diag'"
        ) from None


def import_laplace():
    """laplace-torch's ``Laplace``, or an ``ImportError`` that says how to install it (a
    :class:`~zoo.runtime.packages.BrokenTorchvisionError` for a torchvision of another torch)."""
    require_torchvision("zoo.laplace (laplace-torch)")
    try:
        with dependency_notices_off():
            from laplace import Laplace
    except ImportError as err:
        raise ImportError(
            f'the Laplace baseline needs laplace-torch ({err}): pip install "bnn-zoo[laplace]"'
        ) from None
    return Laplace


def network_at(model, weights: dict) -> torch.nn.Module:
    """A copy of ``model.net`` (the plain architecture) holding ``weights`` at its sample
    sites, which alone are trainable (laplace-torch's Gaussian covers them), its deterministic
    parameters and running statistics as fitted, in evaluation mode (the network as it
    predicts: batch norm reads its running statistics)."""
    net = copy.deepcopy(model.net)
    with torch.no_grad():
        for name, p in net.named_parameters():
            if name in model.site_shapes:
                p.copy_(model.to_parameter(name, weights[name]).to(p))
            p.requires_grad_(name in model.site_shapes)
    return net.eval()


def site_names(model) -> list[str]:
    """The sample sites of ``model.net`` in ``named_parameters`` order: the order of the
    parameter vector laplace-torch indexes (``parameters_to_vector`` of the trainable ones)."""
    return [n for n, _ in model.net.named_parameters() if n in model.site_shapes]


def build(
    model, weights: dict, options: LaplaceOptions, last_layer_name=None, indices=None, backend=None
):
    """laplace-torch's object for ``model`` at ``weights`` (not fitted yet); a subnetwork's
    ``indices`` (:func:`subnetwork_indices`) must be given; ``backend``, a laplace-torch
    curvature class, replaces the one chosen here."""
    Laplace = import_laplace()
    net = network_at(model, weights).to(next(iter(weights.values())).device)
    kwargs: dict[str, Any] = {}
    if options.weights == "subnetwork":
        if indices is None:
            raise ValueError("a subnetwork Laplace needs its indices (subnetwork_indices)")
        kwargs["subnetwork_indices"] = torch.as_tensor(indices, dtype=torch.long).to(
            next(net.parameters()).device
        )
    if options.weights == "last_layer" and last_layer_name is not None:
        kwargs["last_layer_name"] = last_layer_name
    if options.prior_precision not in PRIOR_RULES:
        kwargs["prior_precision"] = float(options.prior_precision)
    if backend is not None:
        kwargs["backend"] = backend
    elif (options.weights, options.hessian) == ("all", "diag"):  # laplace-torch's default backend
        # forms the Jacobian of every weight at once (24 GB for a LeNet-5 on 512 images)
        from laplace.curvature import AsdlGGN

        kwargs["backend"] = AsdlGGN
    task = model.likelihood.task
    if task == "regression" and not getattr(model.likelihood, "learned", True):
        kwargs["sigma_noise"] = float(model.likelihood.noise)  # a fixed noise (a buffer)
    return Laplace(net, task, options.weights, options.hessian, **kwargs)


def posterior_sites(la) -> list[tuple[str, torch.Size]]:
    """The weight sites laplace-torch's Gaussian covers, in the order of its parameter vector
    (``la.mean``, ``la.sample``): the last layer's (weight, then bias) or every trainable
    parameter of the network in ``named_parameters`` order."""
    from laplace.lllaplace import LLLaplace

    if isinstance(la, LLLaplace):  # la.model is laplace-torch's feature extractor
        extractor: Any = la.model
        layer = extractor.last_layer
        prefix = next(n for n, m in extractor.model.named_modules() if m is layer)
        return [(f"{prefix}.{n}", p.shape) for n, p in layer.named_parameters()]
    return [(n, p.shape) for n, p in la.model.named_parameters() if p.requires_grad]


def weight_draws(la, weights: dict, num_samples: int, generator) -> dict[str, torch.Tensor]:
    """``{site: (S, *shape)}``: ``S`` joint draws of ``N(w*, (H + P)^-1)`` over the sites it
    covers; every other site of ``weights`` (a last layer's body, a learned noise) repeats its
    MAP value."""
    vector = la.sample(num_samples, generator=generator).detach()
    draws = {k: v.expand(num_samples, *v.shape) for k, v in weights.items()}
    offset = 0
    for name, shape in posterior_sites(la):
        size = math.prod(shape)
        draws[name] = vector[:, offset : offset + size].reshape(num_samples, *shape)
        offset += size
    if offset != vector.shape[1]:  # a change of laplace-torch's vector layout
        raise RuntimeError(
            f"laplace-torch drew {vector.shape[1]} numbers for sites of {offset}: its "
            "parameter vector's layout changed"
        )
    return draws


def linearised_outputs(la, weights: dict, draws: dict, x: torch.Tensor) -> torch.Tensor:
    """``(S, n, out)``: the network linearised at ``w*``, ``f(x, w*) + J(x) (w_s - w*)``, at
    each draw ``w_s`` (the GLM predictive's model; one forward-mode product per draw)."""

    names = [name for name, _ in posterior_sites(la)]
    net = la.model
    primal = {n: weights[n].to(x.device) for n in names}

    def outputs(params):
        return functional_call(net, params, (x,))

    samples = []
    for s in range(next(iter(draws.values())).shape[0]):
        tangent = {n: draws[n][s].to(x.device) - primal[n] for n in names}
        with dependency_notices_off():  # the first jvp loads torch's decompositions
            out, change, *_ = jvp(outputs, (primal,), (tangent,))
        samples.append((out + change).reshape(x.shape[0], -1))
    return torch.stack(samples).detach()


def check_laplace_model(model, options: LaplaceOptions) -> None:
    """Refuse, before any work, what laplace-torch cannot do with ``model``."""
    if not hasattr(model, "net") or not hasattr(model, "site_shapes"):
        raise TypeError(
            "laplace takes a zoo model built on a plain network (zoo.models.*, or "
            f"zoo.models.from_module(net)); got a {type(model).__name__}"
        )
    likelihood = model.likelihood
    if type(likelihood).__name__ == "HeteroscedasticGaussian":
        raise ValueError(
            "laplace-torch's regression likelihood has one noise level: a heteroscedastic "
            "model is not supported; use noise='learned' or a fixed noise"
        )
    if options.predictive == "probit" and likelihood.task != "classification":
        raise ValueError("predictive='probit' is for classification; use 'glm' or 'nn'")
    if (padded := sorted(getattr(model, "_padding", {}))) and options.weights != "last_layer":
        raise ValueError(f"the sites {padded} leave out an embedding's padding_idx row, which "
                         "laplace-torch's Gaussian over the network's parameters would cover: "
                         "use weights='last_layer', or make the embedding deterministic "
                         "(from_module(net, deterministic=[...]))")  # fmt: skip
    sites = set(model.site_shapes) - {"noise"}
    if options.hessian == "full":
        count = sum(math.prod(s) for n, s in model.site_shapes.items() if n in sites)
        if options.weights == "all" and count > FULL_HESSIAN_MAX:
            raise ValueError(
                f"a full Hessian of all {count:,} weights is a dense {count:,} x {count:,} "
                f"matrix (more than {FULL_HESSIAN_MAX:,} weights are refused); use "
                "hessian='kron' or 'diag', or weights='last_layer'"
            )
