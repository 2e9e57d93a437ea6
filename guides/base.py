"""The per-site machinery that every posterior family shares.

A guide built on :class:`PerSiteGuide` follows Pyro's ``AutoNormal`` pattern: on its first call it
traces the model once (the *prototype trace*), then creates one :class:`SitePosterior` module per
latent sample site, holding that site's variational parameters as ``PyroParam``s. Every later call
samples each site from the distribution its module emits. Run the guide once (``zoo.fit`` does)
before building an optimiser or loading a state dict: the parameters do not exist before that.

Real-valued sites get the guide's family. Sites with a constrained support (a positive noise
scale, say) get a diagonal Normal in the unconstrained space pushed through
``biject_to(support)``.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import itertools
import math
from collections.abc import Callable
from operator import attrgetter

import pyro
import pyro.distributions as dist
import torch
from pyro.infer.autoguide import AutoGuide
from pyro.infer.autoguide.utils import deep_setattr
from pyro.nn import PyroModule
from torch import nn
from torch.distributions import biject_to, constraints

_NAME_COUNTER = itertools.count()
_DIRECT = contextvars.ContextVar("direct_parameters", default=False)


@contextlib.contextmanager
def direct_parameters():
    """Within this block, site modules hand out their (unconstrained, real) parameters directly,
    without a ``pyro.param`` statement per access. ``zoo.fit`` optimises ``guide.parameters()``
    with a torch optimiser and never reads param sites from the trace, so it saves that Python
    overhead; Pyro's own ``SVI`` (which collects params from the trace) runs outside it."""
    token = _DIRECT.set(True)
    try:
        yield
    finally:
        _DIRECT.reset(token)


class SitePosterior(PyroModule):
    """Variational parameters of one sample site and the distribution they define.

    Subclasses take ``init_loc`` (the initial mean, shaped like the site) and ``init_scale`` (the
    initial marginal standard deviation) plus family options, create ``PyroParam``s, and return
    their distribution from :meth:`distribution`.
    """

    family: str = ""

    def __init__(self, init_loc: torch.Tensor, init_scale: float):
        super().__init__()

    @classmethod
    def supports(cls, shape: torch.Size) -> bool:
        """Whether this family can serve a real site of this shape."""
        return True

    def __getattr__(self, name: str):
        if _DIRECT.get():
            pyro_params = self.__dict__.get("_pyro_params")
            if pyro_params is not None and name in pyro_params:
                return self.__dict__["_parameters"][name + "_unconstrained"]
        return super().__getattr__(name)

    def distribution(self) -> dist.TorchDistribution:
        raise NotImplementedError


def inverse_softplus(x: torch.Tensor | float) -> torch.Tensor:
    x = torch.as_tensor(x)
    return x + torch.log(-torch.expm1(-x))


def fan_in(name: str, shapes) -> int:
    """Fan-in of site ``name``: ``prod(shape[1:])`` for a weight; a bias ``layer.bias`` uses the
    fan-in of ``layer.weight``; otherwise the number of elements."""
    shape = shapes[name]
    if len(shape) >= 2:
        return math.prod(shape[1:])
    sibling = shapes.get(name.rsplit(".", 1)[0] + ".weight") if "." in name else None
    if sibling is not None and len(sibling) >= 2:
        return math.prod(sibling[1:])
    return max(math.prod(shape), 1)


def kaiming_uniform_like(shape: torch.Size, fan_in: int, like: torch.Tensor) -> torch.Tensor:
    """PyTorch's default layer init: ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``."""
    bound = 1.0 / math.sqrt(max(fan_in, 1))
    return torch.empty(shape, dtype=like.dtype, device=like.device).uniform_(-bound, bound)


def check_family_options(guide_cls: type, site_cls: type, options: dict) -> None:
    """Refuse options that the family's site class does not take, naming those it does."""
    params = inspect.signature(site_cls.__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    known = [n for n in params if n not in ("self", "init_loc", "init_scale")]
    unknown = sorted(set(options) - set(known))
    if unknown:
        spec = inspect.signature(guide_cls.site_spec).parameters
        named = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        listed = sorted({*known, *(n for n, p in spec.items() if p.kind in named)})
        own = f"its options are {listed}" if listed else "it has no options of its own"
        raise TypeError(
            f"{guide_cls.__name__} got unknown option(s) {unknown}; {own}, and every family "
            "takes init_scale, init_loc and init_module"
        )


class PerSiteGuide(AutoGuide):
    """Base class of the posterior families: one :class:`SitePosterior` per latent site.

    Parameters
    ----------
    model : callable
        A Pyro model, e.g. a ``zoo.models`` network called as ``model(x, y=None)``.
    init_scale : float
        Initial marginal standard deviation of every weight (not a variance).
    init_loc : {"kaiming"} or callable
        Initial means. ``"kaiming"`` draws PyTorch's default layer init
        ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))`` for tensors (a bias uses the fan-in of the
        weight of the same layer) and the prior median for scalars and constrained sites.
        A callable gets the prototype-trace site dict and returns the initial value.
    init_module : torch.nn.Module, optional
        A plain network whose parameters (``fc1.weight``, ...) give the initial means of the
        sites of the same names, e.g. a pretrained deterministic net.
    create_plates : callable, optional
        As in :class:`pyro.infer.autoguide.AutoGuide`.
    **family_options
        Options of the family (see each subclass).
    """

    site_class: type[SitePosterior]

    def __init__(
        self,
        model: Callable,
        *,
        init_scale: float = 0.01,
        init_loc: str | Callable = "kaiming",
        init_module: nn.Module | None = None,
        create_plates: Callable | None = None,
        **family_options,
    ):
        super().__init__(model, create_plates=create_plates)
        # A unique name keeps the parameters of two guides of one family apart in Pyro's
        # global param store (two AutoNormals would silently share them).
        self._pyro_name = f"{type(self).__name__}_{next(_NAME_COUNTER)}"
        if init_scale <= 0:
            raise ValueError(f"init_scale must be positive, got {init_scale}")
        if not (callable(init_loc) or init_loc == "kaiming"):
            raise ValueError(f"init_loc must be 'kaiming' or a callable, got {init_loc!r}")
        self.init_scale = float(init_scale)
        self.init_loc = init_loc
        self._init_values = (
            {} if init_module is None else dict(init_module.state_dict(keep_vars=False))
        )
        self.site_class, self.family_options = self.site_spec(**family_options)
        check_family_options(type(self), self.site_class, self.family_options)
        self._transforms: dict[str, constraints.Constraint] = {}
        self._site_names: list[str] = []

    # ---- pickling (zoo.persist saves guides whole) ----
    def __getstate__(self):
        state = super().__getstate__()
        state = dict(state)
        if callable(state.get("init_loc")):
            state["init_loc"] = "kaiming"  # only used before the parameters exist
        state["_init_values"] = {}
        state.pop("_site_cache", None)
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        # A fresh name, so a loaded guide never shares Pyro param-store entries with another.
        _rename(self, f"{type(self).__name__}_{next(_NAME_COUNTER)}")

    # ---- which family serves which site ----
    @classmethod
    def site_spec(cls, **options) -> tuple[type[SitePosterior], dict]:
        """The site class and its options for this family given the guide's family options."""
        return cls.site_class, options

    def site_class_for(self, name: str, shape: torch.Size) -> type[SitePosterior]:
        """The :class:`SitePosterior` class for a real site; subclasses may override."""
        if not self.site_class.supports(shape):
            raise ValueError(
                f"The {self.site_class.family!r} family cannot serve site {name!r} of shape "
                f"{tuple(shape)}. Use guides.AutoMixed to give that site another family, "
                f"e.g. {{'{name}': 'diagonal', '*': '{self.site_class.family}'}}."
            )
        return self.site_class

    def site_options_for(self, name: str, cls: type[SitePosterior]) -> dict:
        return self.family_options if cls is self.site_class else {}

    # ---- prototype ----
    def _initial_value(self, name: str, site: dict) -> torch.Tensor:
        value = site["value"].detach()
        if name in self._init_values:
            init = self._init_values[name].to(dtype=value.dtype, device=value.device)
            if init.shape != value.shape:
                raise ValueError(
                    f"init_module's {name!r} has shape {tuple(init.shape)} but the model's "
                    f"site has shape {tuple(value.shape)}"
                )
            return init.clone()
        if callable(self.init_loc):
            return torch.as_tensor(self.init_loc(site)).to(value).detach().clone()
        fn = site["fn"]
        if value.dim() == 0 or not _is_real(fn.support):
            return _prior_median(fn, value)
        shapes = {n: s["value"].shape for n, s in self.prototype_trace.iter_stochastic_nodes()}
        return kaiming_uniform_like(value.shape, fan_in(name, shapes), value)

    def _setup_prototype(self, *args, **kwargs):
        super()._setup_prototype(*args, **kwargs)
        self.__dict__.pop("_site_cache", None)
        self.sites = PyroModule()
        self._site_names = []
        for name, site in self.prototype_trace.iter_stochastic_nodes():
            fn = site["fn"]
            if site["cond_indep_stack"]:
                plate = site["cond_indep_stack"][0].name
                raise ValueError(
                    f"Site {name!r} is a local latent variable inside plate {plate!r}; "
                    f"{type(self).__name__} serves global weights only. Move the site out of "
                    "the plate or use a separate guide for it (pyro.infer.autoguide.AutoGuideList)."
                )
            if fn.support.is_discrete:
                raise ValueError(
                    f"Site {name!r} ({type(fn).__name__}) is discrete; the posterior families "
                    "here are Gaussian and need continuous sites (enumerate or marginalise it)."
                )
            init = self._initial_value(name, site)
            if _is_real(fn.support):
                self._transforms[name] = None
                cls = self.site_class_for(name, init.shape)
                options = self.site_options_for(name, cls)
            else:
                transform = biject_to(fn.support)
                self._transforms[name] = transform
                init = transform.inv(init)
                from guides.diagonal import DiagonalSite

                cls, options = DiagonalSite, {}
            deep_setattr(self.sites, name, cls(init, self.init_scale, **options))
            self._site_names.append(name)

    # ---- sampling ----
    def site_posterior(self, name: str) -> SitePosterior:
        """The :class:`SitePosterior` module holding the parameters of ``name``."""
        cache = self.__dict__.setdefault("_site_cache", {})
        module = cache.get(name)
        if module is None:
            module = cache[name] = attrgetter(name)(self.sites)
        return module

    def get_posterior(self, name: str) -> dist.TorchDistribution:
        """The variational distribution of site ``name`` (a torch ``Distribution``).

        Real sites get the family's distribution (``mean``, ``variance``, ``rsample``,
        ``log_prob``, ``entropy``, ``covariance_matrix``); constrained sites a transformed
        diagonal Normal.
        """
        if self.prototype_trace is None:
            raise RuntimeError("Run the guide once (e.g. guide(x, y)) before asking for its sites")
        if name not in self._transforms:
            raise KeyError(f"No latent site {name!r}; sites are {self._site_names}")
        d = self.site_posterior(name).distribution()
        transform = self._transforms[name]
        if transform is not None:
            d = dist.TransformedDistribution(d, [transform])
        return d

    def forward(self, *args, **kwargs) -> dict[str, torch.Tensor]:
        """Sample every latent site once; returns ``{site name: value}``."""
        if self.prototype_trace is None:
            self._setup_prototype(*args, **kwargs)
        self._create_plates(*args, **kwargs)
        return {name: pyro.sample(name, self.get_posterior(name)) for name in self._site_names}

    @torch.no_grad()
    def sample_posterior(self, num_samples: int) -> dict[str, torch.Tensor]:
        """``num_samples`` joint draws of every site, stacked as ``(num_samples, *site_shape)``."""
        return {name: self.get_posterior(name).sample((num_samples,)) for name in self._site_names}

    @torch.no_grad()
    def median(self, *args, **kwargs) -> dict[str, torch.Tensor]:
        """Posterior median of every site (the mean of a Gaussian site)."""
        out = {}
        for name in self._site_names:
            d = self.site_posterior(name).distribution()
            m = d.mean.clone()
            transform = self._transforms[name]
            out[name] = m if transform is None else transform(m)
        return out

    @torch.no_grad()
    def quantiles(self, quantiles, *args, **kwargs) -> dict[str, torch.Tensor]:
        """Marginal quantiles of every site, shaped ``(len(quantiles), *site_shape)``."""
        out = {}
        for name in self._site_names:
            d = self.site_posterior(name).distribution()
            q = torch.as_tensor(quantiles, dtype=d.mean.dtype, device=d.mean.device)
            q = q.reshape((-1,) + (1,) * d.mean.dim())
            values = dist.Normal(d.mean, d.variance.sqrt()).icdf(q)
            transform = self._transforms[name]
            out[name] = values if transform is None else transform(values)
        return out

    @property
    def site_names(self) -> list[str]:
        return list(self._site_names)

    def num_variational_parameters(self) -> int:
        """Number of scalar variational parameters (all sites)."""
        return sum(p.numel() for p in self.parameters())


def _rename(module: nn.Module, name: str) -> None:
    module._pyro_name = name
    for key, child in module._modules.items():
        if isinstance(child, PyroModule):
            _rename(child, f"{name}.{key}")


def _is_real(support) -> bool:
    while isinstance(support, constraints.independent):
        support = support.base_constraint
    return support is constraints.real


def _prior_median(fn, value: torch.Tensor) -> torch.Tensor:
    try:
        median = fn.icdf(torch.full_like(value, 0.5)) if hasattr(fn, "icdf") else None
    except NotImplementedError:
        median = None
    if median is None or not torch.isfinite(median).all():
        median = fn.sample((31,)).median(0).values if value.dim() == 0 else fn.sample()
    return median.detach().reshape(value.shape).clone()
