"""One site's variational parameters: the :class:`SitePosterior` base class, the diagonal
Normal site that every family uses for constrained sites, and the initialisation helpers.

A :class:`SitePosterior` holds its parameters as ``PyroParam``s (a constrained parameter is
stored unconstrained, as Pyro does) and returns its distribution from :meth:`distribution`.
Reading a parameter attribute gives its constrained value on every route: inside Pyro's
``SVI`` through ``pyro.param``, and inside ``zoo``'s own loops (:func:`direct_parameters`)
without a ``pyro.param`` statement per access.
"""

from __future__ import annotations

import contextlib
import contextvars
import math

import pyro
import pyro.distributions as dist
import torch
import torch.nn.functional as F
from pyro import poutine
from pyro.nn import PyroModule, PyroParam
from torch.distributions import constraints, transform_to

from guides.gaussian import DiagonalNormal

_DIRECT = contextvars.ContextVar("direct_parameters", default=False)


@contextlib.contextmanager
def direct_parameters():
    """Within this block, site modules hand out their parameters without a ``pyro.param``
    statement per access: the unconstrained tensor itself for a real parameter, its transform
    (``transform_to(constraint)``) for a constrained one, so every value equals what Pyro's
    ``SVI`` reads. Pyro's global param store is neither read nor written. ``zoo.fit`` optimises
    ``guide.parameters()`` with a torch optimiser and never reads param sites from a trace, so
    it saves that per-access overhead; Pyro's own ``SVI`` runs outside this block."""
    token = _DIRECT.set(True)
    try:
        yield
    finally:
        _DIRECT.reset(token)


class SitePosterior(PyroModule):
    """Variational parameters of one sample site and the distribution they define.

    Subclasses take ``init_loc`` (the initial mean, shaped like the site) and ``init_scale`` (the
    initial marginal standard deviation) plus family options, create ``PyroParam`` objects, and
    return their distribution from :meth:`distribution`.
    """

    family: str = ""
    #: The site class for sites this one cannot serve (``supports`` is False), or ``None``
    #: to refuse them: the matrix normal gives 1-D sites (biases) the diagonal family.
    fallback: type[SitePosterior] | None = None
    #: The names of the Pyro parameters holding the site's posterior mean and, for a diagonal
    #: Gaussian, the ``rho`` of its standard deviation ``softplus(rho)`` (:mod:`guides.pairs`,
    #: what an optimiser may read); ``None``: the family states none.
    MEAN_PARAMETER: str | None = None
    SCALE_PARAMETER: str | None = None

    def __init__(self, init_loc: torch.Tensor, init_scale: float):
        super().__init__()

    #: Bytes a step holds per weight of the site besides its parameters' (a draw, its noise,
    #: their gradients and the family's own temporaries), measured by ``python
    #: benchmarks/step_memory.py`` and rounded up; :meth:`step_bytes` reads it.
    STEP_BYTES_PER_WEIGHT: int = 20

    @classmethod
    def step_bytes(cls, shape: tuple[int, ...], options: dict) -> int:
        """Bytes a step of a fit holds for a site of ``shape`` built with ``options``, besides
        its variational parameters (:mod:`guides.memory`)."""
        return math.prod(shape) * cls.STEP_BYTES_PER_WEIGHT

    @classmethod
    def supports(cls, shape: torch.Size) -> bool:
        """Whether this family can serve a real site of this shape."""
        return True

    @classmethod
    def constrained_class(cls) -> type[SitePosterior]:
        """The site class this family gives a constrained site (in its unconstrained space):
        the diagonal Normal, unless the family says otherwise."""
        return DiagonalSite

    @classmethod
    def guide_options(cls, options: dict) -> tuple[str, dict]:
        """The family name and guide options that give a site of this class with ``options``
        (how ``guides.AutoMixed`` saves its rules as plain data)."""
        return cls.family, dict(options)

    def __getattr__(self, name: str):
        if _DIRECT.get():
            pyro_params = self.__dict__.get("_pyro_params")
            if pyro_params is not None and name in pyro_params:
                value = self.__dict__["_parameters"][name + "_unconstrained"]
                constraint = pyro_params[name][0]
                if constraint is constraints.real:
                    return value
                return transform_to(constraint)(value)
        return super().__getattr__(name)

    def distribution(self) -> dist.TorchDistribution:
        """The variational distribution of the site (event shape = the site's shape)."""
        raise NotImplementedError

    def upgrade_state(self, state: dict, prefix: str) -> None:
        """Rewrite in place the entries of a saved ``state`` (a guide's ``state_dict``, this
        site's under ``prefix``) that an earlier release wrote in another parameterisation
        (``guides.families.whvi``'s ``loc``, ``s1``, ``s2``); nothing by default."""


#: What a family's ``site_spec`` returns: its site class (``None``: a family over several sites,
#: which serves its sites itself) and the options the class is built with.
SiteSpec = tuple[type["SitePosterior"] | None, dict]


def param(value: torch.Tensor, constraint=constraints.real) -> torch.Tensor:
    """A Pyro parameter to assign to a site's attribute: ``self.loc = param(x)`` stores
    ``PyroParam(x, constraint)``, whose attribute then reads as the constrained tensor (the
    unconstrained one is ``loc_unconstrained``). Typed as that tensor, which is what code reads."""
    return PyroParam(value, constraint)  # type: ignore[return-value]


class DiagonalSite(SitePosterior):
    """Parameters ``loc`` and ``rho`` (``softplus(rho)`` is the standard deviation)."""

    family = "diagonal"
    MEAN_PARAMETER, SCALE_PARAMETER = "loc", "rho"

    def __init__(self, init_loc: torch.Tensor, init_scale: float):
        super().__init__(init_loc, init_scale)
        self.loc = param(init_loc.detach().clone())
        self.rho = param(torch.full_like(init_loc, float(inverse_softplus(init_scale))))

    def distribution(self) -> DiagonalNormal:
        base = dist.Normal(self.loc, F.softplus(self.rho))
        return DiagonalNormal(base, self.loc.dim())


def register_strict_lower(module: torch.nn.Module, size: int, device) -> None:
    """Buffers ``rows`` and ``cols`` of ``module``: the strict lower triangle of a ``size x size``
    matrix, row by row, the order in which a packed parameter of ``size (size - 1) / 2`` numbers
    holds it (see :func:`unit_lower_triangular`)."""
    rows, cols = torch.tril_indices(size, size, -1, device=device)
    module.register_buffer("rows", rows, persistent=False)
    module.register_buffer("cols", cols, persistent=False)


def unit_lower_triangular(
    lower: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, size: int
) -> torch.Tensor:
    """``I + N``, ``(size, size)``, with ``N``'s strict lower triangle read from the packed
    ``lower`` of ``size (size - 1) / 2`` numbers at ``rows, cols``; for ``lower`` of shape
    ``(K, size (size - 1) / 2)``, ``K`` such matrices, ``(K, size, size)``."""
    if lower.dim() == 1:
        unit = lower.new_zeros(size, size).index_put((rows, cols), lower)
    else:
        blocks = torch.arange(lower.shape[0], device=lower.device).unsqueeze(-1)
        unit = lower.new_zeros(lower.shape[0], size, size)
        unit = unit.index_put((blocks, rows, cols), lower)
    return unit + torch.eye(size, dtype=unit.dtype, device=unit.device)


def inverse_softplus(x: torch.Tensor | float) -> torch.Tensor:
    """``softplus^{-1}(x) = x + log(1 - exp(-x))`` for ``x > 0``."""
    x = torch.as_tensor(x)
    return x + torch.log(-torch.expm1(-x))


def fan_in(name: str, shapes) -> int:
    """Fan-in of site ``name`` from the sites' shapes alone: ``prod(shape[1:])`` for a weight
    (the inputs that feed one output: ``in_features``, ``in_channels * kernel`` of a
    convolution, an RNN's ``weight_ih_l0`` its input size and ``weight_hh_l0`` its hidden
    size); a bias uses its weight's (``bias`` of ``weight``, an RNN's ``bias_ih_l0`` of
    ``weight_ih_l0``, attention's ``in_proj_bias`` of ``in_proj_weight``); any other site
    its number of elements. Layers whose shape does not say it (an embedding, whose lookup
    reads one row) are the model's: ``zoo.models.semantics.fan_ins``."""
    shape = shapes[name]
    if len(shape) >= 2:
        return math.prod(shape[1:])
    head, _, leaf = name.rpartition(".")
    if "bias" in leaf:
        weight = leaf.replace("bias", "weight")
        sibling = shapes.get(f"{head}.{weight}" if head else weight)
        if sibling is not None and len(sibling) >= 2:
            return math.prod(sibling[1:])
    return max(math.prod(shape), 1)


def kaiming_uniform_like(shape: torch.Size, fan_in: int, like: torch.Tensor) -> torch.Tensor:
    """PyTorch's default layer init: ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``."""
    bound = 1.0 / math.sqrt(max(fan_in, 1))
    return torch.empty(shape, dtype=like.dtype, device=like.device).uniform_(-bound, bound)


def is_real(support) -> bool:
    """Whether a support is (an ``independent`` of) the real line."""
    while isinstance(support, constraints.independent):
        support = support.base_constraint
    return support is constraints.real


def prior_median(fn, value: torch.Tensor) -> torch.Tensor:
    """The median of the prior ``fn``, shaped like ``value`` (a Monte Carlo median where it has
    no finite ``icdf``)."""
    try:
        median = fn.icdf(torch.full_like(value, 0.5)) if hasattr(fn, "icdf") else None
    except NotImplementedError:
        median = None
    if median is None or not torch.isfinite(median).all():
        median = fn.sample((31,)).median(0).values if value.dim() == 0 else fn.sample()
    return median.detach().reshape(value.shape).clone()


def check_global_continuous(guide: str, name: str, site: dict) -> None:
    """Refuse a latent site inside a plate or with a discrete support, naming it."""
    if site["cond_indep_stack"]:
        plate = site["cond_indep_stack"][0].name
        raise ValueError(
            f"Site {name!r} is a local latent variable inside plate {plate!r}; {guide} serves "
            "global weights only. Move the site out of the plate or use a separate guide for it "
            "(pyro.infer.autoguide.AutoGuideList)."
        )
    if site["fn"].support.is_discrete:
        raise ValueError(
            f"Site {name!r} ({type(site['fn']).__name__}) is discrete; the posterior families "
            "here are Gaussian and need continuous sites (enumerate or marginalise it)."
        )


def check_fixed_priors(guide, trace, args: tuple, kwargs: dict) -> None:
    """For a family that carries its own prior (a site class with ``reads_prior``): refuse a
    model whose prior at one of those sites has learned or sampled parameters, which the site
    could not cancel. The model is traced once more, and each such site's prior must give the
    prototype's log-density at the new draw, without a gradient to any parameter."""
    names = [n for n in guide.site_names if getattr(guide.site_posterior(n), "reads_prior", 0)]
    if not names:
        return

    with torch.enable_grad():  # a guide may be set up inside a no_grad block
        again = poutine.block(poutine.trace(guide.model).get_trace)(*args, **kwargs)
    for name in names:
        value = again.nodes[name]["value"].detach()
        with torch.enable_grad():
            first = trace.nodes[name]["fn"].log_prob(value)
            second = again.nodes[name]["fn"].log_prob(value)
        if first.requires_grad or second.requires_grad or not torch.allclose(first, second):
            raise ValueError(
                f"the {guide.family!r} family carries its own prior and cancels the model's at "
                f"site {name!r}, which needs that prior fixed; the model's prior there has "
                "learned or sampled scales (a prior fitted to the data or a hierarchical one). "
                "Give the model a fixed prior (prior=None, the task's default, or a number), or "
                "that site another family through guides.AutoMixed."
            )


def serving_class(
    site_cls: type[SitePosterior] | None, name: str, shape, what: str
) -> type[SitePosterior]:
    """``site_cls`` if it supports ``shape``, else its ``fallback``; else a clear error."""
    if site_cls is None:  # a family over several sites serves its sites itself
        raise TypeError(f"{what} has no per-site class to serve site {name!r}")
    if site_cls.supports(shape):
        return site_cls
    if site_cls.fallback is not None:
        return site_cls.fallback
    raise ValueError(
        f"{what} cannot serve site {name!r} of shape {tuple(shape)}. Use guides.AutoMixed to "
        f"give that site another family, e.g. {{'{name}': 'diagonal', '*': ...}}."
    )


def check_param_store(guide: torch.nn.Module) -> None:
    """Refuse, on a guide's first call through Pyro (outside :func:`direct_parameters`), a
    parameter that Pyro's global param store already holds under the same name with another
    shape: a guide of another model, called directly and then dropped, whose name this guide
    took (``guides.base``, "Pyro's param store"). Pyro's ``pyro.param`` would hand this guide
    that value. The same shape is Pyro's own resume (``param_store.load``) and is kept. Reads
    Pyro's ``_pyro_name``/``_pyro_params`` of ``PyroModule``, here only."""
    if _DIRECT.get():  # zoo's own loops read the guide's tensors, never the store
        return
    store = pyro.get_param_store()
    if not len(store):
        return
    for module in guide.modules():
        for attr in module.__dict__.get("_pyro_params") or ():
            full = f"{module._pyro_name}.{attr}"
            own = module._parameters.get(attr + "_unconstrained")
            if full not in store or own is None:
                continue
            held = tuple(store[full].shape)
            if held != tuple(own.shape):
                raise ValueError(
                    f"Pyro's param store holds {full!r} of shape {held}, left by an earlier "
                    f"guide of that name (a guide called directly keeps its parameters there), "
                    f"and this guide's is {tuple(own.shape)}: its first call would read the "
                    "stale value. Call pyro.clear_param_store() before using this guide, or fit "
                    "it with zoo.fit, which does not use the store"
                )
