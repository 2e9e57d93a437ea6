"""One Gaussian across several sites: correlations between layers.

Every other family works per weight tensor, so none can hold a correlation between two layers.
:class:`AutoJoint` puts one Gaussian over a chosen set of ``K`` scalars from several sites,

    z ~ N(mu, Sigma),    Sigma = L L^T  (full: ``L`` lower-triangular K x K, positive diagonal)
                         Sigma = D^2 + F F^T  (``rank=r``: ``D`` diagonal, ``F`` K x r),

and every other scalar of those sites is a point mass; sites outside the set take another
family (``rest``, the point mass by default). Each guide call draws ``z`` once, as Pyro's
``AutoMultivariateNormal`` does: an auxiliary site (``_<guide>_latent``) carries ``log q(z)``,
and each joint site is a point mass at its scalars' values (``log q = 0`` there), so
``Trace_ELBO`` subtracts the joint ``log q`` exactly once, scaled by ``kl_weight`` as every
latent site is (:mod:`zoo.inference.elbo`). The closed-form KL of ``elbo="meanfield"`` does not
apply across sites: the joint term is its Monte Carlo estimate ``log p(w) - log q(z)``.

Each joint site's mean lives in its point-mass ``loc`` (every scalar's: the chosen ones are
``mu``), so ``median()`` is the mean and an unchosen scalar is its own point. Costs per step:
full, ``O(K^2)`` memory and time (the product ``L eps``; the log-density of the draw is read
from ``eps``, :class:`DrawnMultivariateNormal`); rank ``r``, ``O(K r^2)``. A full factor of
more than :data:`guides.joint_gaussian.FULL_MAX` scalars is refused when the guide is set up.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Unpack

import pyro
import pyro.distributions as dist
import torch

from guides.base import PerSiteGuide
from guides.checks import GuideStart, InvalidArgument, check_family_options, check_keywords, is_int
from guides.joint_gaussian import (
    JointCovariance,
    JointLocSite,
    JointSiteMarginal,
    check_size,
    indices,
)
from guides.registry import get, is_per_site, per_site_families
from guides.site import SitePosterior, check_param_store, serving_class


class AutoJoint(PerSiteGuide, family="joint", composite=True):
    """One Gaussian over chosen scalars of several sites, any family on the others.

    Parameters
    ----------
    model : callable
        The Pyro model.
    sites : str or list of str, default "*"
        ``fnmatch`` patterns of the real sites in the joint set (every pattern must match a
        site); a constrained site (a learned noise) takes ``rest``.
    masks : mapping, optional
        ``{site: bool tensor shaped like the site, or flat indices}``: only those scalars of
        the site are in the joint set, the others are point masses. Default: every scalar.
    rank : int, optional
        ``None``: a full covariance (a Cholesky factor, at most
        :data:`guides.joint_gaussian.FULL_MAX` scalars); an int: a diagonal plus a
        rank-``rank`` factor.
    rest : str or (str, dict), default "map"
        The family of the sites outside the joint set (a name of ``guides.available()``,
        with options).
    init_scale, init_loc_fn, init_module, create_plates
        See :class:`guides.base.PerSiteGuide`; ``init_scale`` is the initial marginal standard
        deviation of every joint scalar.
    """

    site_class = JointLocSite
    #: Its options are its constructor's arguments (a joint set's), not a site class's.
    options_in_init = True

    def __init__(
        self,
        model: Callable,
        sites: str | list[str] = "*",
        *,
        masks: Mapping | None = None,
        rank: int | None = None,
        rest: str | tuple = "map",
        **start: Unpack[GuideStart],
    ):
        check_keywords(type(self).__name__, start, GuideStart)
        super().__init__(model, **start)
        listed = isinstance(sites, (list, tuple)) and all(isinstance(p, str) for p in sites)
        if not (isinstance(sites, str) or (listed and sites)):
            raise InvalidArgument(
                f"sites must be an fnmatch pattern or a non-empty list of them ('*', "
                f"['fc2.*']), got {sites!r}"
            )
        self.patterns = [sites] if isinstance(sites, str) else list(sites)
        if rank is not None and (not is_int(rank) or rank < 1):
            raise InvalidArgument(
                f"rank must be None (a full covariance) or an int >= 1, got {rank!r}"
            )
        self.rank = rank
        if masks is not None and not isinstance(masks, Mapping):
            raise InvalidArgument(f"masks must be a mapping site -> mask, got {masks!r}")
        masks = dict(masks or {})
        self._mask_shapes = {
            name: tuple(torch.as_tensor(m).shape)
            for name, m in masks.items()
            if torch.is_tensor(m) and m.dtype == torch.bool
        }
        self.masks = {name: indices(name, m) for name, m in masks.items()}
        family, options = rest if isinstance(rest, tuple) else (rest, {})
        if not isinstance(family, str) or not isinstance(options, Mapping):
            raise InvalidArgument(f"rest must be a family name or (name, options), got {rest!r}")
        rest_cls = get(family)
        if not is_per_site(rest_cls):
            raise InvalidArgument(
                f"rest={family!r} is a family over several sites; the sites outside the joint "
                f"set take a per-site family: one of {per_site_families()}"
            )
        self._rest_site, self._rest_options = rest_cls.site_spec(**dict(options))
        check_family_options(rest_cls, self._rest_site, self._rest_options)
        self.rest: tuple[str, dict] = (rest_cls.family or family, dict(options))
        self._joint: list[tuple[str, torch.Tensor | None, int, int]] = []

    def objective(self) -> str:
        """``"conditional"`` when some scalars are point masses (left out by masks, or outside
        the joint set under ``rest="map"``), else what the rest family's ``-loss`` bounds."""
        self._require_setup()
        partial = any(
            index is not None and count < self.site_posterior(name).loc.numel()
            for name, index, _, count in self._joint
        )
        joint = {name for name, *_ in self._joint}
        rest = get(self.rest[0]).OBJECTIVE if set(self._site_names) - joint else "model"
        return "conditional" if partial or rest == "map" else rest

    # ---- which sites are joint ----
    def is_joint(self, name: str) -> bool:
        """Whether site ``name`` (a real one) is in the joint set."""
        return any(fnmatch.fnmatchcase(name, p) for p in self.patterns)

    def site_class_for(self, name: str, shape: torch.Size) -> type[SitePosterior]:
        if self.is_joint(name):
            return JointLocSite
        return serving_class(self._rest_site, name, shape, f"the rest's {self.rest[0]!r} family")

    def constrained_class_for(self, name: str) -> type[SitePosterior]:
        return self._rest_site.constrained_class() if self._rest_site else JointLocSite

    def site_options_for(self, name: str, cls: type[SitePosterior]) -> dict:
        return self._rest_options if cls is self._rest_site else {}

    def select(self, names: list[str]) -> dict[str, torch.Tensor]:
        """The flat indices of the joint scalars of each joint site (here: ``masks``, or every
        scalar); :class:`AutoSubnetwork` chooses them from the initial means."""
        return dict(self.masks)

    def _setup_prototype(self, *args, **kwargs):
        super()._setup_prototype(*args, **kwargs)
        names = [n for n in self._site_names if self._transforms[n] is None and self.is_joint(n)]
        unused = [p for p in self.patterns if not fnmatch.filter(names, p)]
        if unused:
            raise ValueError(
                f"{type(self).__name__} patterns {unused} match no real site of the model; its "
                f"sites are {self._site_names}"
            )
        chosen = self.select(names)
        stray = sorted(set(chosen) - set(names))
        if stray:
            raise ValueError(f"masks name sites {stray} outside the joint set {names}")
        self._joint, offset = [], 0
        for name in names:
            numel = self.site_posterior(name).loc.numel()
            index = chosen.get(name)
            shape = self._mask_shapes.get(name)
            loc = self.site_posterior(name).loc
            if shape is not None and shape != tuple(loc.shape):
                raise ValueError(
                    f"the bool mask of {name!r} has shape {shape}, the site {tuple(loc.shape)}: "
                    "a mask marks the site's own scalars (or pass flat indices)"
                )
            if index is not None:
                index = index.to(self.site_posterior(name).loc.device)
                if index.numel() and int(index.max()) >= numel:
                    raise ValueError(f"the mask of {name!r} indexes past its {numel} scalars")
            count = numel if index is None else index.numel()
            self._joint.append((name, index, offset, count))
            offset += count
        self.masks = {n: i.cpu() for n, i, _, _ in self._joint if i is not None}
        check_size(offset, self.rank)
        like = self.site_posterior(names[0]).loc
        self.joint = JointCovariance(offset, self.init_scale, self.rank, like)

    # ---- the joint vector ----
    def joint_mean(self) -> torch.Tensor:
        """``mu``, the ``K`` joint scalars' means, in site order."""
        parts = []
        for name, index, _, _ in self._joint:
            flat = self.site_posterior(name).loc.reshape(-1)
            parts.append(flat if index is None else flat[index])
        return torch.cat(parts)

    def joint_distribution(self) -> dist.TorchDistribution:
        """``N(mu, Sigma)`` of the joint scalars (a ``MultivariateNormal`` or
        ``LowRankMultivariateNormal``)."""
        self._require_setup()
        return self.joint.distribution(self.joint_mean())

    def joint_sites(self) -> list[str]:
        """The sites with scalars in the joint Gaussian, in the order of its ``K``-vector."""
        self._require_setup()
        return [name for name, _, _, count in self._joint if count]

    def joint_index(self, name: str) -> torch.Tensor:
        """Positions of site ``name``'s joint scalars in the ``K``-vector."""
        for site, _, offset, count in self._joint:
            if site == name:
                return torch.arange(offset, offset + count, device=self.joint.rho.device)
        raise KeyError(f"site {name!r} is not in the joint set")

    def site_scalars(self, name: str) -> torch.Tensor:
        """The flat indices, within site ``name``, of its joint scalars."""
        for site, index, _, count in self._joint:
            if site == name:
                return torch.arange(count, device=self.joint.rho.device) if index is None else index
        raise KeyError(f"site {name!r} is not in the joint set")

    def joint_block(self, name: str) -> dist.TorchDistribution:
        """The Gaussian of site ``name``'s joint scalars alone (a marginal of the joint)."""
        index = self.joint_index(name)
        mean = self.joint_mean()[index]
        if self.rank is None:
            tril = self.joint.scale_tril()[index]
            return dist.MultivariateNormal(mean, covariance_matrix=tril @ tril.T)
        diag = self.joint.scale()[index].pow(2)
        return dist.LowRankMultivariateNormal(mean, self.joint.factor()[index], diag)

    def joint_variance(self) -> dict[str, torch.Tensor]:
        """``{joint site: variances shaped like the site}`` (zero at point-mass scalars)."""
        variance = self.joint.variance()
        out = {}
        for name, index, offset, count in self._joint:
            loc = self.site_posterior(name).loc
            part = variance[offset : offset + count]
            flat = part if index is None else loc.new_zeros(loc.numel()).index_put((index,), part)
            out[name] = flat.reshape(loc.shape)
        return out

    def _scatter(self, z: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each joint site's value for joint draws ``z`` (``(..., K)``)."""
        out = {}
        batch = z.shape[:-1]
        for name, index, offset, count in self._joint:
            loc = self.site_posterior(name).loc
            part = z[..., offset : offset + count]
            if index is None:
                value = part
            else:
                flat = loc.reshape(-1).expand(batch + (loc.numel(),))
                value = flat.scatter(-1, index.expand(batch + (count,)), part)
            out[name] = value.reshape(batch + loc.shape)
        return out

    # ---- sampling ----
    def forward(self, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:
        """Draw the joint vector once (an auxiliary site), then every site; returns
        ``{site name: value}``."""
        if self.prototype_trace is None:
            self._setup_prototype(*args, **kwargs)
            check_param_store(self)
        self._create_plates(*args, **kwargs)
        latent = f"_{self._pyro_name}_latent"
        z = pyro.sample(latent, self.joint_distribution(), infer={"is_auxiliary": True})
        joint = self._scatter(z)
        out = {}
        for name in self._site_names:
            if name in joint:
                value = joint[name]
                out[name] = pyro.sample(
                    name, dist.Delta(value, event_dim=value.dim() - z.dim() + 1)
                )
            else:
                out[name] = pyro.sample(name, self.get_posterior(name))
        return out

    def get_posterior(self, name: str) -> dist.TorchDistribution:
        """A joint site's marginal (:class:`JointSiteMarginal`), else the site's family's."""
        self._require_setup()
        if any(site == name for site, *_ in self._joint):
            return JointSiteMarginal(self, name)
        return super().get_posterior(name)

    @torch.no_grad()
    def sample_posterior(self, num_samples: int) -> dict[str, torch.Tensor]:
        """``num_samples`` joint draws of every site, ``(num_samples, *site_shape)``."""
        self._require_setup()
        joint = self._scatter(self.joint_distribution().sample((num_samples,)))
        out = {}
        for name in self._site_names:
            if name in joint:
                out[name] = joint[name]
            else:
                out[name] = PerSiteGuide.get_posterior(self, name).sample((num_samples,))
        return out

    @torch.no_grad()
    def quantiles(
        self, quantiles: Sequence[float] | torch.Tensor, *args: Any, **kwargs: Any
    ) -> dict[str, torch.Tensor]:
        """Marginal quantiles, ``(len(quantiles), *site_shape)``: a joint scalar's from its
        Gaussian marginal, a point's its value."""
        out = super().quantiles(quantiles, *args, **kwargs)
        for name, sd in ((n, v.sqrt()) for n, v in self.joint_variance().items()):
            loc = self.site_posterior(name).loc
            q = torch.as_tensor(quantiles, dtype=loc.dtype, device=loc.device)
            out[name] = loc + sd * torch.special.ndtri(q.reshape((-1,) + (1,) * loc.dim()))
        return out

    # ---- saving as plain data ----
    def spec(self) -> dict:
        """Plain data that rebuilds this guide: its patterns, the chosen scalars of each site
        (flat indices), the rank and the rest's family."""
        masks = {name: index.tolist() for name, index in self.masks.items()}
        family, given = self.rest
        rest = (family, get(family).saved_options(given))
        options = {"sites": self.patterns, "masks": masks, "rank": self.rank, "rest": rest}
        return {"family": self.family, "options": options, "init_scale": self.init_scale}

    @classmethod
    def from_spec(cls, model: Callable, spec: dict) -> AutoJoint:
        """The guide that :meth:`spec` describes (parameters not yet created)."""
        options = dict(spec["options"])
        family, given = options["rest"]
        options["rest"] = (family, get(family).read_options(given))
        return cls(model, init_scale=spec["init_scale"], **options)
