"""Prior scales fitted to the data: type-II maximum likelihood and a hierarchical prior.

A fixed ``N(0, 1)`` on every weight ignores the layer's width and the data's size. Both priors
here keep an isotropic Normal per *group* of weights (a layer by default) and let the data set
its standard deviation ``s_g``:

``LearnedNormalPrior`` (empirical Bayes, type-II maximum likelihood)
    ``s_g`` is a parameter of the model, maximised with the ELBO (``zoo.fit`` optimises the
    model's parameters with the guide's). For a group of ``n_g`` weights the ELBO depends on
    ``s_g`` only through ``E_q[log N(w_g; 0, s_g^2 I)] = -n_g log s_g - E_q|w_g|^2 / (2 s_g^2)
    + const``, whose maximiser, for the current ``q``, is

        s_g^2 = E_q|w_g|^2 / n_g = (|m_g|^2 + sum_i Var_q[w_i]) / n_g,

    the mean second moment of the group's weights under ``q`` (MacKay's and laplace-torch's
    update, the M-step of variational EM). Gradient steps on ``s_g`` reach the same fixed point
    alongside ``q``. The closed-form KL (``elbo="meanfield"``) stays exact: ``s_g`` enters it as
    a differentiable prior scale.

``HierarchicalNormalPrior`` (a latent scale)
    ``s_g`` is a latent site ``prior_scale.<group>`` with its own prior (``LogNormal(hyper_loc,
    hyper_scale)``), which the guide fits like every other site (a log-normal posterior for the
    Gaussian families, a point for ``"map"``) and which predictions average over.

With ``fan_in_scaled=True`` (the default) the group's value is a *gain* ``g`` and a site's prior
standard deviation is ``g / sqrt(fan_in)`` (a bias uses its layer's fan-in), so one number suits
layers of every width and ``per="network"`` shares one gain across them.

When each is sound
------------------
Type-II maximum likelihood is a point estimate of ``s_g``: sound when each group has many
weights and the data constrain them (then ``q(s_g)`` of the hierarchical prior would be narrow
too), cheap, and deterministic. It overfits ``s_g`` when they do not, and the ELBO has a
degenerate optimum: ``q_g`` equal to the prior and ``s_g -> 0`` (the group switched off) costs
no KL at all, so on small data, where a layer's KL outweighs what its weights add to the
likelihood, a learned scale can collapse. ``min_scale`` keeps the numbers finite and
:meth:`LearnedNormalPrior.diagnose` (issued by ``zoo.fit``) warns when a scale fell below
``collapse_ratio`` of its start. With point-mass weights (``"map"``) the joint maximum over
``w`` and ``s`` is degenerate for the same reason: use a fixed or a hierarchical prior there.

The hierarchical prior keeps ``s_g`` uncertain and its hyperprior's density vanishes at 0,
which penalises the collapse; it suits few groups or little data and costs one scalar site per
group. A mean-field guide treats ``s_g`` and ``w_g`` as independent, which understates their
joint spread (the "funnel"); with many weights per group ``q(s_g)`` is close to a point at the
type-II value anyway. Optimising ``s_g`` on the training data makes the final ELBO an optimistic
model-comparison score for either.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import pyro
import pyro.distributions as dist
import torch
from pyro.distributions import TorchDistribution
from torch import nn

from zoo.priors.fixed import IsotropicNormal, Prior

#: How sites share a scale: one per layer (weight and bias), one per site, one for the network.
PER = ("layer", "site", "network")
#: Name prefix of the hierarchical prior's latent sites: ``prior_scale.<group>``.
SITE_PREFIX = "prior_scale."


def scale_groups(site_names: Iterable[str], per: str) -> dict[str, str]:
    """``{site: group}``: the layer (``fc1`` for ``fc1.weight``; ``root`` for a parameter of the
    top module), the site itself, or ``network`` for all."""
    if per not in PER:
        raise ValueError(f"per must be one of {PER}, got {per!r}")
    if per == "site":
        return {name: name for name in site_names}
    if per == "network":
        return {name: "network" for name in site_names}
    return {name: name.rpartition(".")[0] or "root" for name in site_names}


class GroupedScalePrior(Prior):
    """Base of the priors with one scale per group of sites (see the module docstring)."""

    def __init__(self, per: str = "layer", fan_in_scaled: bool = True):
        super().__init__()
        scale_groups((), per)
        self.per, self.fan_in_scaled = per, bool(fan_in_scaled)
        self.site_group: dict[str, str] = {}
        self.groups: list[str] = []
        self._factor: dict[str, float] = {}
        self._index: dict[str, int] = {}

    def bind(self, site_shapes: Mapping[str, torch.Size], fan_ins: Mapping[str, int]) -> None:
        groups = scale_groups(site_shapes, self.per)
        if self.site_group and self.site_group != groups:
            raise ValueError(
                f"this {type(self).__name__} already belongs to a model with sites "
                f"{sorted(self.site_group)}; its scales are fitted per model: build one per model"
            )
        self.site_group = groups
        self.groups = list(dict.fromkeys(groups.values()))
        self._index = {name: self.groups.index(group) for name, group in groups.items()}
        self._factor = {
            name: 1 / math.sqrt(max(fan_ins[name], 1)) if self.fan_in_scaled else 1.0
            for name in site_shapes
        }

    def _require_bound(self, name: str) -> None:
        if name not in self._index:
            raise KeyError(
                f"{type(self).__name__} has no site {name!r}: it learns the scales of the sites "
                "of the model it was given to (known: "
                f"{sorted(self._index) or 'none yet'})"
            )

    def distribution(self, shape: torch.Size, fan_in: int) -> TorchDistribution:
        raise TypeError(
            f"{type(self).__name__} gives each site's prior from its fitted scale: call "
            "site_distribution(name, shape, fan_in, latent) (the model does)"
        )

    def spec(self) -> dict | None:
        if not self._is_built_in():
            return None
        return {"class": type(self).__name__, "args": self._args()}

    def _args(self) -> dict:
        return {"per": self.per, "fan_in_scaled": self.fan_in_scaled}

    def _site_prior(self, scale: torch.Tensor, shape) -> IsotropicNormal:
        zero = torch.zeros((), dtype=scale.dtype, device=scale.device)
        return IsotropicNormal(zero, scale, shape, batch_shape=scale.shape, zero_loc=True)


class LearnedNormalPrior(GroupedScalePrior, builtin=True):
    """``N(0, s_g^2)`` per group with ``s_g`` maximised with the ELBO (type-II maximum
    likelihood; see the module docstring for the update it performs and when it is sound).

    Parameters
    ----------
    init_scale : float
        Starting value of every group's scale: a standard deviation, or with ``fan_in_scaled``
        the gain ``g`` of ``s = g / sqrt(fan_in)``.
    per : {"layer", "site", "network"}
        Which sites share a scale.
    fan_in_scaled : bool
        Whether the learned value is a gain divided by ``sqrt(fan_in)`` per site.
    min_scale : float
        Floor of the learned value (``min_scale + exp(raw)``), so that a collapsing scale stays
        finite.
    collapse_ratio : float
        :meth:`diagnose` warns when a value ends below this fraction of ``init_scale``.

    Notes
    -----
    The learned values are ``model.prior.scales()``; they are saved with the fit.
    """

    def __init__(
        self,
        init_scale: float = 1.0,
        per: str = "layer",
        fan_in_scaled: bool = True,
        min_scale: float = 1e-3,
        collapse_ratio: float = 0.01,
    ):
        super().__init__(per, fan_in_scaled)
        if not init_scale > min_scale > 0:
            raise ValueError(
                f"need init_scale > min_scale > 0, got init_scale={init_scale}, "
                f"min_scale={min_scale}"
            )
        if not 0 < collapse_ratio < 1:
            raise ValueError(f"collapse_ratio must be in (0, 1), got {collapse_ratio}")
        self.init_scale, self.collapse_ratio = float(init_scale), float(collapse_ratio)
        self.min_scale = float(min_scale)
        #: Unconstrained values, one per group: ``value = min_scale + exp(raw_scale)``.
        self.raw_scale = nn.Parameter(torch.zeros(0))

    def bind(self, site_shapes: Mapping[str, torch.Size], fan_ins: Mapping[str, int]) -> None:
        super().bind(site_shapes, fan_ins)
        if self.raw_scale.numel() != len(self.groups):
            start = math.log(self.init_scale - self.min_scale)
            self.raw_scale = nn.Parameter(
                torch.full((len(self.groups),), start, device=self.raw_scale.device)
            )

    def values(self) -> torch.Tensor:
        """The groups' learned values (gains, or standard deviations), a differentiable
        tensor in the order of ``groups``."""
        return self.raw_scale.exp() + self.min_scale

    def scales(self) -> dict[str, float]:
        """``{group: value}``: each group's learned gain (``fan_in_scaled``) or standard
        deviation."""
        return dict(zip(self.groups, self.values().detach().tolist(), strict=True))

    def stddev(self, name: str) -> float:
        """The prior standard deviation of site ``name``'s weights."""
        self._require_bound(name)
        return float(self.values().detach()[self._index[name]]) * self._factor[name]

    def site_distribution(
        self, name: str, shape: torch.Size, fan_in: int, latent: Mapping[str, torch.Tensor]
    ) -> TorchDistribution:
        self._require_bound(name)
        return self._site_prior(self.values()[self._index[name]] * self._factor[name], shape)

    def diagnose(self) -> list[str]:
        limit = self.collapse_ratio * self.init_scale
        return [
            f"the learned prior scale of {group!r} fell from {self.init_scale:g} to {value:.3g} "
            f"(below {self.collapse_ratio:g} of its start): the ELBO is switching these "
            "weights off, which little data allows (their KL outweighs what they add to the "
            "likelihood) and point-mass weights always do (their log prior grows without bound "
            "as weights and scale shrink together). Use a fixed prior, HierarchicalNormalPrior, "
            "or per='network' (one scale shared by more weights)."
            for group, value in self.scales().items()
            if value < limit
        ]

    def _args(self) -> dict:
        return {
            **super()._args(),
            "init_scale": self.init_scale,
            "min_scale": self.min_scale,
            "collapse_ratio": self.collapse_ratio,
        }

    def extra_repr(self) -> str:
        shown = ", ".join(f"{g}={v:.3g}" for g, v in self.scales().items())
        return f"per={self.per!r}, fan_in_scaled={self.fan_in_scaled}, scales=({shown})"


class HierarchicalNormalPrior(GroupedScalePrior, builtin=True):
    """``w | s_g ~ N(0, s_g^2)`` with a latent scale per group, ``s_g ~ LogNormal(hyper_loc,
    hyper_scale)``: the site ``prior_scale.<group>`` (the gain ``g`` when ``fan_in_scaled``).

    The default ``LogNormal(0, 1)`` puts the gain's median at 1 (PyTorch's default
    initialisation has gain ``1/sqrt(3)``) and 95% of its mass between 0.14 and 7.1.
    """

    hyper_loc: torch.Tensor  # buffers (0-d)
    hyper_scale: torch.Tensor

    def __init__(
        self,
        per: str = "layer",
        fan_in_scaled: bool = True,
        hyper_loc: float = 0.0,
        hyper_scale: float = 1.0,
    ):
        super().__init__(per, fan_in_scaled)
        if not hyper_scale > 0:
            raise ValueError(f"hyper_scale must be positive, got {hyper_scale}")
        self.register_buffer("hyper_loc", torch.tensor(float(hyper_loc)))
        self.register_buffer("hyper_scale", torch.tensor(float(hyper_scale)))

    def hyperprior(self) -> dist.LogNormal:
        """The prior of each group's scale (or gain)."""
        return dist.LogNormal(self.hyper_loc, self.hyper_scale)

    def site_names(self) -> list[str]:
        """The latent sites of the scales, ``prior_scale.<group>``."""
        return [SITE_PREFIX + group for group in self.groups]

    def sample_latent(self) -> dict[str, torch.Tensor]:
        hyper = self.hyperprior()
        return {name: pyro.sample(name, hyper) for name in self.site_names()}

    def site_distribution(
        self, name: str, shape: torch.Size, fan_in: int, latent: Mapping[str, torch.Tensor]
    ) -> TorchDistribution:
        self._require_bound(name)
        value = latent[SITE_PREFIX + self.site_group[name]]
        return self._site_prior(value * self._factor[name], shape)

    def _args(self) -> dict:
        return {
            **super()._args(),
            "hyper_loc": float(self.hyper_loc),
            "hyper_scale": float(self.hyper_scale),
        }

    def extra_repr(self) -> str:
        return (
            f"per={self.per!r}, fan_in_scaled={self.fan_in_scaled}, "
            f"hyperprior=LogNormal({float(self.hyper_loc):g}, {float(self.hyper_scale):g})"
        )
