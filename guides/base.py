"""The per-site guide that every posterior family shares.

A guide built on :class:`PerSiteGuide` follows Pyro's ``AutoNormal`` pattern: on its first call it
traces the model once (the *prototype trace*), then creates one :class:`~guides.site.SitePosterior`
module per latent sample site, holding that site's variational parameters as ``PyroParam``s.
Every later call samples each site from the distribution its module emits (after
:meth:`PerSiteGuide.share_site_work`). Run the guide once (``zoo.fit`` does) before building an
optimiser or loading a state dict: the parameters do not exist before that.

Real-valued sites get the guide's family. Sites with a constrained support (a positive noise
scale, say) get a diagonal Normal in the unconstrained space pushed through
``biject_to(support)``.

A family is one subclass that names itself: ``class AutoX(PerSiteGuide, family="x")`` registers
``"x"`` (see :mod:`guides.registry`). The base knows no concrete family.

Pyro's param store
------------------
Parameter names are ``<ClassName>.sites.<site>.<param>``, as ``AutoNormal``'s are, so Pyro's
workflow (``pyro.get_param_store().save(path)``; in a new session a guide of the same model,
``load(path)``, then the guide's first call) restores them. Unlike ``AutoNormal``, two guides of
one class alive at once never share parameters: a second live one is named ``<ClassName>_1``
(the first free suffix). A guide lives until its last reference goes; one that only a reference
cycle keeps (an exception's traceback, for instance) keeps its name until Python's cycle
collector runs. ``zoo``'s own functions never read or write the global store.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any

import pyro
import pyro.distributions as dist
import torch
from pyro.infer.autoguide import AutoGuide
from pyro.infer.autoguide.utils import deep_setattr
from pyro.nn import PyroModule
from torch import nn
from torch.distributions import Transform, biject_to

from guides import initial, registry
from guides.checks import COMMON_OPTIONS, check_family_options, is_number  # noqa: F401
from guides.memory import check_fit_memory, fit_memory
from guides.names import free_name, live_guides, rename
from guides.site import (
    DiagonalSite,
    SitePosterior,
    SiteSpec,
    check_fixed_priors,
    check_global_continuous,
    check_param_store,
    is_real,
    serving_class,
)


class PerSiteGuide(AutoGuide):
    """Base class of the posterior families: one site module per latent site.

    Parameters
    ----------
    model : callable
        A Pyro model, e.g. a ``zoo.models`` network called as ``model(x, y=None)``.
    init_scale : float
        Initial marginal standard deviation of every weight (not a variance); a site started at
        a trained network's weights (``"auto"``) starts with at most a hundredth of their root
        mean square (:data:`guides.initial.TRAINED_RELATIVE_SCALE`).
    init_loc_fn : {"auto", "kaiming"} or callable
        Initial means, as Pyro's ``init_loc_fn``: a callable gets the prototype-trace site dict
        and returns the initial value (``pyro.infer.autoguide.init_to_median`` and the other
        Pyro init strategies work). ``"kaiming"`` draws PyTorch's default layer init
        ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))`` for tensors (a bias uses the fan-in of the weight
        of the same layer) and the prior median for scalars and constrained sites. ``"auto"``
        (the default) takes the means the model offers, ``model.initial_means()`` (a
        converted trained network's weights, ``zoo.models.from_module``), at the sites it
        offers them, and ``"kaiming"`` elsewhere.
    init_module : torch.nn.Module, optional
        A plain network whose parameters (``fc1.weight``, ...) give the initial means of the
        sites of the same names, e.g. a pretrained deterministic net.
    create_plates : callable, optional
        As in :class:`pyro.infer.autoguide.AutoGuide`.
    family_options : keyword arguments
        Options of the family (see each subclass).

    Notes
    -----
    To subclass: ``class AutoX(PerSiteGuide, family="x")`` registers the family ``"x"``. Set
    ``site_class`` (a :class:`~guides.site.SitePosterior`), or override :meth:`site_spec` to choose
    the site class from the options, and list notable configurations in ``variants`` (the test suite
    runs each).
    """

    site_class: type[SitePosterior] | None = None
    #: The registered name, set by ``family=`` in the class statement.
    family: str | None = None
    #: Named configurations of the family (label suffix -> options): its documented variants.
    variants: dict[str, dict] = {"": {}}

    def __init_subclass__(cls, family: str | None = None, composite: bool = False, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.family = family
        if family is not None:
            registry.register(family, cls, composite=composite)

    def __init__(
        self,
        model: Callable,
        *,
        init_scale: float = 0.01,
        init_loc_fn: str | Callable = "auto",
        init_module: nn.Module | None = None,
        create_plates: Callable | None = None,
        **family_options: Any,
    ):
        super().__init__(model, create_plates=create_plates)
        if not (is_number(init_scale) and math.isfinite(init_scale) and init_scale > 0):
            raise ValueError(f"init_scale must be a positive number, got {init_scale!r}")
        if not (callable(init_loc_fn) or init_loc_fn in ("auto", "kaiming")):
            raise ValueError(
                f"init_loc_fn must be 'auto', 'kaiming' or a callable, got {init_loc_fn!r}"
            )
        self.init_scale = float(init_scale)
        self.init_loc_fn = init_loc_fn
        self._init_values = (
            {} if init_module is None else dict(init_module.state_dict(keep_vars=False))
        )
        self.options = dict(family_options)
        self.site_class, self.family_options = self.site_spec(**family_options)
        check_family_options(type(self), self.site_class, self.family_options)
        self._transforms: dict[str, Transform | None] = {}
        self._site_names: list[str] = []
        self._pyro_name = free_name(type(self).__name__)
        live_guides.add(self)

    # ---- what the fit's ELBO bounds ----
    #: What a fit's ``-loss`` bounds with this family (:data:`OBJECTIVES`).
    OBJECTIVE = "model"
    #: How the family is fitted when the caller does not say (:class:`guides.registry.Recipe`).
    RECIPE = registry.Recipe()
    #: Whether the family starts at the weights a model offers (``init_loc_fn="auto"``): a
    #: fit from a trained network's weights then runs at a lower default rate (``zoo.fit``).
    STARTS_AT_WEIGHTS = True

    def objective(self) -> str:
        """What ``-loss`` of a fit with this guide bounds (:data:`guides.registry.OBJECTIVES`): the
        evidence of the model as written (``"model"``) for a Gaussian family over every site;
        families that are not say otherwise (a point mass, MC dropout, WHVI, point masses
        beside a Gaussian)."""
        return self.OBJECTIVE

    # ---- pickling (files of earlier versions, opened with allow_pickle=True) ----
    def __setstate__(self, state):
        state = dict(state)
        if "init_loc" in state:  # the name before init_loc_fn
            state["init_loc_fn"] = state.pop("init_loc")
        state.setdefault("options", dict(state.get("family_options", {})))
        super().__setstate__(state)
        rename(self, free_name(type(self).__name__))
        if self.prototype_trace is not None:
            self.prototype_trace = _slim(self.prototype_trace)
        live_guides.add(self)

    # ---- saving as plain data ----
    def spec(self) -> dict:
        """Plain data (names, numbers, strings) that rebuilds this guide, without parameter
        values, through :func:`guides.registry.build`."""
        if self.family is None or registry.get(self.family) is not type(self):
            raise TypeError(
                f"{type(self).__name__} is not a registered family, so it cannot be saved as "
                "plain data: declare it as class X(PerSiteGuide, family='name')"
            )
        options = self.saved_options(self.options)
        return {"family": self.family, "options": options, "init_scale": self.init_scale}

    @classmethod
    def from_spec(cls, model: Callable, spec: dict) -> PerSiteGuide:
        """The guide of ``model`` that :meth:`spec` describes (parameters not yet created)."""
        return cls(model, init_scale=spec["init_scale"], **cls.read_options(spec["options"]))

    @classmethod
    def saved_options(cls, options: dict) -> dict:
        """The family options a spec records for the given ``options``: with the defaults
        that decide the parameters' shapes filled in, so that a later release's default does
        not change what the saved state means. Default: ``options`` unchanged."""
        return dict(options)

    @classmethod
    def read_options(cls, options: dict) -> dict:
        """A saved spec's family options as this release reads them: a family whose default
        changed puts back the old one where a spec written before does not name the option
        (its saved state has that layout). Default: ``options`` unchanged."""
        return dict(options)

    # ---- which family serves which site ----
    @classmethod
    def site_spec(cls, **options: Any) -> SiteSpec:
        """The site class and its options for this family given the guide's family options."""
        return cls.site_class, options

    def site_class_for(self, name: str, shape: torch.Size) -> type[SitePosterior]:
        """The :class:`SitePosterior` class for a real site: the family's, or its ``fallback``
        for a shape it cannot serve (the same rule in :class:`guides.AutoMixed`)."""
        return serving_class(self.site_class, name, shape, f"the {self.family!r} family")

    def constrained_class_for(self, name: str) -> type[SitePosterior]:
        """The site class for a constrained site (``DiagonalSite`` unless the family says)."""
        return self.site_class.constrained_class() if self.site_class else DiagonalSite

    def site_options_for(self, name: str, cls: type[SitePosterior]) -> dict:
        """Options for the site module of ``name`` of class ``cls``."""
        return self.family_options if cls is self.site_class else {}

    # ---- prototype ----
    def loc_for_mean(self, name: str, mean: torch.Tensor) -> torch.Tensor:
        """The initial location parameter of site ``name`` under which the posterior's mean
        network is ``mean`` (a trained network's weights, offered by the model): ``mean``
        itself, unless a family's mean is not its location (MC dropout's)."""
        return mean

    def _setup_prototype(self, *args, **kwargs):
        super()._setup_prototype(*args, **kwargs)
        self.__dict__.pop("_site_cache", None)
        self.sites = PyroModule()
        self._site_names = []
        means = initial.Means(self, self._init_values, self.init_loc_fn)
        plans = []
        for name, site in self._prototype().iter_stochastic_nodes():
            check_global_continuous(type(self).__name__, name, site)
            init = means.value(name, site)
            if is_real(site["fn"].support):
                self._transforms[name] = None
                cls = self.site_class_for(name, init.shape)
                options = self.site_options_for(name, cls)
                if getattr(cls, "reads_prior", False):  # a family that carries its own prior
                    options = {**options, "prior": site["fn"]}
            else:
                transform = biject_to(site["fn"].support)
                self._transforms[name] = transform
                init = transform.inv(init)
                cls, options = self.constrained_class_for(name), {}
            plans.append((name, cls, init, means.scale(name, self.init_scale), options))
        label = self.family or type(self).__name__
        check_fit_memory(label, [(name, cls, init.shape, scale, options)
                                 for name, cls, init, scale, options in plans])  # fmt: skip
        self._step_bytes = sum(cls.step_bytes(tuple(init.shape), options)
                               for _, cls, init, _, options in plans)  # fmt: skip
        for name, cls, init, scale, options in plans:
            try:
                module = cls(init, scale, **options)
            except ValueError as err:  # a family that cannot serve this site says which
                raise ValueError(f"{label} at site {name!r}: {err}") from None
            deep_setattr(self.sites, name, module)
            self._site_names.append(name)
        check_fixed_priors(self, self.prototype_trace, args, kwargs)
        self.prototype_trace = _slim(self.prototype_trace)

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
        self._require_setup()
        if name not in self._transforms:
            raise KeyError(f"No latent site {name!r}; sites are {self._site_names}")
        d = self.site_posterior(name).distribution()
        transform = self._transforms[name]
        if transform is not None:
            push = getattr(d, "push_forward", None)  # a family's own image under a transform
            d = push(transform) if push else dist.TransformedDistribution(d, [transform])
        return d

    def forward(self, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:
        """Sample every latent site once; returns ``{site name: value}``."""
        if self.prototype_trace is None:
            self._setup_prototype(*args, **kwargs)
            check_param_store(self)
        self._create_plates(*args, **kwargs)
        sharing = self.share_site_work()
        try:
            return {name: pyro.sample(name, self.get_posterior(name)) for name in self._site_names}
        finally:
            for site in sharing:
                site.shared = None

    def share_site_work(self) -> Sequence[SitePosterior]:
        """Hand the sites work they share in one call (``site.shared``; a family batches small
        per-site operations) and return them; their ``shared`` is reset after the call."""
        return []

    @torch.no_grad()
    def sample_posterior(self, num_samples: int) -> dict[str, torch.Tensor]:
        """``num_samples`` joint draws of every site, stacked as ``(num_samples, *site_shape)``."""
        self._require_setup()
        return {name: self.get_posterior(name).sample((num_samples,)) for name in self._site_names}

    @torch.no_grad()
    def median(self, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:
        """Posterior median of every site's marginals (the mean of a Gaussian site)."""
        self._require_setup()
        out = {}
        for name in self._site_names:
            d = self.site_posterior(name).distribution()
            icdf = getattr(d, "marginal_icdf", None)
            m = d.mean.clone() if icdf is None else icdf(0.5)
            transform = self._transforms[name]
            out[name] = m if transform is None else transform(m)
        return out

    @torch.no_grad()
    def quantiles(
        self, quantiles: Sequence[float] | torch.Tensor, *args: Any, **kwargs: Any
    ) -> dict[str, torch.Tensor]:
        """Marginal quantiles of every site, ``(len(quantiles), *site_shape)``: a Gaussian's from
        its mean and sd, any other from its ``marginal_icdf`` (a point mass: its value)."""
        self._require_setup()
        out = {}
        for name in self._site_names:
            d = self.site_posterior(name).distribution()
            q = torch.as_tensor(quantiles, dtype=d.mean.dtype, device=d.mean.device)
            q = q.reshape((-1,) + (1,) * d.mean.dim())
            icdf = getattr(d, "marginal_icdf", None)
            if icdf is None:  # a Gaussian
                values = d.mean + d.variance.sqrt() * torch.special.ndtri(q)
            else:
                values = icdf(q)
            transform = self._transforms[name]
            out[name] = values if transform is None else transform(values)
        return out

    @property
    def site_names(self) -> list[str]:
        """Names of the latent sites, in the model's order (empty before the first call)."""
        return list(self._site_names)

    def site_shapes(self) -> dict[str, tuple[int, ...]]:
        """``{site: shape}`` of every latent site."""
        self._require_setup()
        return {n: tuple(self._prototype().nodes[n]["value"].shape) for n in self._site_names}

    def num_variational_parameters(self) -> int:
        """Number of scalar variational parameters (all sites)."""
        return sum(p.numel() for p in self.parameters())

    def fit_memory(self) -> int:
        """Bytes a fit of this guide takes at least (:func:`guides.memory.fit_memory`: 20 a
        variational parameter, and what a step holds per weight of each site, its draw, noise,
        gradients and the family's temporaries); larger than the machine, the guide is refused
        when it is set up, before its parameters are allocated."""
        nodes = self._prototype().nodes
        step = getattr(self, "_step_bytes", None)
        if step is None:  # a guide pickled before the count: the default per weight
            weights = sum(nodes[name]["value"].numel() for name in self._site_names)
            step = weights * SitePosterior.STEP_BYTES_PER_WEIGHT
        return fit_memory(self.num_variational_parameters(), step)

    def _require_setup(self) -> None:
        self._prototype()

    def _prototype(self) -> Any:
        """The prototype trace (a ``pyro.poutine.Trace`` of the model's sites, shapes only),
        once the guide has run."""
        if self.prototype_trace is None:
            raise RuntimeError(
                f"this {type(self).__name__} has not been run yet, so it has no parameters: call "
                "it once on example inputs (guide(x, y)) or fit it with zoo.fit first"
            )
        return self.prototype_trace


def _slim(trace):
    """The prototype trace without data: each sample site's value becomes a ``meta`` tensor of
    its shape and dtype (later calls read shapes only), and the example inputs are replaced by
    ``meta`` tensors, so a guide holds no copy of sampled weights or training data."""
    for site in trace.nodes.values():
        if site["type"] == "sample" and torch.is_tensor(site.get("value")):
            site["value"] = torch.empty_like(site["value"], device="meta")
        if site["type"] == "args":
            site["args"] = tuple(_meta(a) for a in site["args"])
            site["kwargs"] = {k: _meta(v) for k, v in site["kwargs"].items()}
    return trace


def _meta(value):
    return torch.empty_like(value, device="meta") if torch.is_tensor(value) else value
