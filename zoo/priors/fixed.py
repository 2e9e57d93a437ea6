"""Weight priors of fixed scales, and the :class:`Prior` interface. Each prior is an
``nn.Module`` whose numbers are buffers (or parameters, for the scales :mod:`zoo.priors.fitted`
fits), so ``model.to(device)`` moves them with the model and
every prior sample is drawn on the model's device.

A prior returns, per site, a distribution whose event shape is the whole weight tensor:
``prior.distribution(shape, fan_in)``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pyro.distributions as dist
import torch
from pyro.distributions import TorchDistribution
from torch import nn
from torch.distributions import constraints
from torch.distributions.kl import register_kl

from guides.families.mc_dropout import MCDropoutWeight, dropout_kl
from guides.gaussian import DiagonalNormal, StructuredGaussian, expand_to, gaussian_kl
from guides.kernels import squared_norm

#: Prior classes that :func:`from_spec` rebuilds, by class name (``class P(Prior, builtin=True)``).
BUILT_IN: dict[str, type] = {}


class IsotropicNormal(TorchDistribution):
    """``N(loc, scale^2 I)`` over a whole tensor of shape ``event_shape``. ``loc`` and ``scale``
    are scalars, or tensors of the batch shape (one per draw of a sampled prior scale). The same
    density as ``Normal(loc, scale).expand(shape).to_event(k)``, with a fused ``log_prob``: one
    reduction instead of a tensor of elementwise terms."""

    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}
    has_rsample = True

    def __init__(
        self,
        loc: float | torch.Tensor,
        scale: float | torch.Tensor,
        event_shape: Sequence[int],
        batch_shape: Sequence[int] = (),
        validate_args: bool | None = None,
        zero_loc: bool = False,
    ):
        self.loc, self.scale = torch.as_tensor(loc), torch.as_tensor(scale)
        # Known at construction (no device sync): log_prob then skips ``value - loc``.
        self.zero_loc = bool(zero_loc)
        super().__init__(torch.Size(batch_shape), torch.Size(event_shape), validate_args)

    def _per_element(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` (scalar or batch-shaped, a sampled hyperparameter) with trailing event dims."""
        return t.reshape(t.shape + (1,) * len(self.event_shape))

    @property
    def support(self) -> constraints.Constraint:
        return constraints.independent(constraints.real, len(self.event_shape))

    def expand(self, batch_shape: Sequence[int], _instance: Any = None) -> Any:
        return IsotropicNormal(
            self.loc, self.scale, self.event_shape, batch_shape, zero_loc=self.zero_loc
        )

    @property
    def mean(self) -> torch.Tensor:
        return self._per_element(self.loc).expand(self.batch_shape + self.event_shape)

    @property
    def variance(self) -> torch.Tensor:
        return self._per_element(self.scale).pow(2).expand(self.batch_shape + self.event_shape)

    def rsample(self, sample_shape: Sequence[int] = ()) -> torch.Tensor:
        shape = self._extended_shape(torch.Size(sample_shape))
        noise = torch.randn(shape, dtype=self.scale.dtype, device=self.scale.device)
        return self._per_element(self.loc) + self._per_element(self.scale) * noise

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        k = len(self.event_shape)
        n = math.prod(self.event_shape)
        diff = value if self.zero_loc else value - self._per_element(self.loc)
        sq = squared_norm(diff.reshape(value.shape[: value.dim() - k] + (-1,)))
        log_norm = (self.scale.log() + 0.5 * math.log(2 * math.pi)) * -n  # a fit's graph folds
        # log_norm - sq / (2 scale^2): one operation on the weights' term once it is folded
        lp = torch.addcdiv(log_norm, sq, self.scale.pow(2), value=-0.5)
        return expand_to(lp, self.batch_shape)


@register_kl(StructuredGaussian, IsotropicNormal)
@register_kl(DiagonalNormal, IsotropicNormal)
def _kl_gaussian_isotropic(q, p):
    if q.event_shape != p.event_shape:
        raise NotImplementedError
    return gaussian_kl(q, p._per_element(p.loc), p._per_element(p.scale), p.batch_shape)


@register_kl(MCDropoutWeight, IsotropicNormal)
def _kl_dropout_isotropic(q, p):
    if q.event_shape != p.event_shape:
        raise NotImplementedError
    return dropout_kl(q, p._per_element(p.loc), p._per_element(p.scale), p.batch_shape)


class Prior(nn.Module):
    """Base class of the weight priors.

    A prior answers ``distribution(shape, fan_in)``: the prior of a site of this shape whose
    layer has this fan-in. Priors with hyperparameters of their own (:mod:`zoo.priors.fitted`)
    also use the hooks the model calls, in this order:

    - :meth:`bind` once, when a model takes the prior: the model's sites and fan-ins;
    - :meth:`sample_latent` at the start of every model call: ``pyro.sample`` the prior's own
      latent sites (a hierarchical scale), returning their values;
    - :meth:`site_distribution` per weight site, given those values;
    - :meth:`diagnose` after ``zoo.fit``: warnings about the fitted hyperparameters.

    ``class MyPrior(Prior, builtin=True)`` makes a prior rebuildable from plain data
    (:meth:`spec`, :func:`from_spec`), as the saved fits need; a user's own prior stays
    ``builtin=False`` and ``zoo.load`` then needs the model passed again.
    """

    def __init_subclass__(cls, builtin: bool = False, **kwargs):
        super().__init_subclass__(**kwargs)
        if builtin:
            BUILT_IN[cls.__name__] = cls

    def distribution(self, shape: torch.Size, fan_in: int) -> TorchDistribution:
        """The prior of a site of this ``shape`` whose layer has this ``fan_in``."""
        raise NotImplementedError

    def bind(self, site_shapes: Mapping[str, torch.Size], fan_ins: Mapping[str, int]) -> None:
        """Called by the model that takes this prior, with its sites' shapes and fan-ins."""

    def sample_latent(self) -> dict[str, torch.Tensor]:
        """``pyro.sample`` the prior's own latent sites (none by default)."""
        return {}

    def site_distribution(
        self, name: str, shape: torch.Size, fan_in: int, latent: Mapping[str, torch.Tensor]
    ) -> TorchDistribution:
        """The prior of site ``name`` given the values ``latent`` of :meth:`sample_latent`;
        by default :meth:`distribution`."""
        return self.distribution(shape, fan_in)

    def diagnose(self) -> list[str]:
        """Warnings about the prior's fitted state (``zoo.fit`` issues them at its end)."""
        return []

    def spec(self) -> dict | None:
        """Plain data that rebuilds this prior (:func:`from_spec`), or ``None`` for a prior
        class of the user's."""
        args = {name: float(buffer) for name, buffer in self.named_buffers()}
        return {"class": type(self).__name__, "args": args} if self._is_built_in() else None

    def _is_built_in(self) -> bool:
        return BUILT_IN.get(type(self).__name__) is type(self)


class NormalPrior(Prior, builtin=True):
    """Isotropic ``N(loc, scale^2)`` on every weight; ``scale`` is a standard deviation."""

    _zero_loc = False  # set per instance; the class default serves priors pickled before it
    loc: torch.Tensor  # buffers (0-d)
    scale: torch.Tensor

    def __init__(self, scale: float = 1.0, loc: float = 0.0):
        super().__init__()
        if scale <= 0:
            raise ValueError(f"prior scale must be positive, got {scale}")
        self.register_buffer("loc", torch.tensor(float(loc)))
        self.register_buffer("scale", torch.tensor(float(scale)))
        self._zero_loc = float(loc) == 0.0

    def distribution(self, shape: torch.Size, fan_in: int) -> TorchDistribution:
        return IsotropicNormal(self.loc, self.scale, shape, zero_loc=self._zero_loc)

    def extra_repr(self) -> str:
        return f"loc={self.loc.item():g}, scale={self.scale.item():g}"


class LayerwiseNormalPrior(Prior, builtin=True):
    """``N(0, gain^2 / fan_in)`` per layer (a bias uses its layer's fan-in)."""

    gain: torch.Tensor  # a buffer (0-d)

    def __init__(self, gain: float = 1.0):
        super().__init__()
        if gain <= 0:
            raise ValueError(f"gain must be positive, got {gain}")
        self.register_buffer("gain", torch.tensor(float(gain)))

    def extra_repr(self) -> str:
        return f"gain={self.gain.item():.4g}"

    def distribution(self, shape: torch.Size, fan_in: int) -> TorchDistribution:
        scale = self.gain / math.sqrt(max(fan_in, 1))
        return IsotropicNormal(torch.zeros_like(self.gain), scale, shape, zero_loc=True)


class ScaleMixtureNormal(TorchDistribution):
    """Elementwise ``pi N(0, sigma1^2) + (1 - pi) N(0, sigma2^2)`` (Blundell et al. 2015)."""

    arg_constraints = {
        "pi": constraints.unit_interval,
        "sigma1": constraints.positive,
        "sigma2": constraints.positive,
    }
    support = constraints.real
    has_rsample = False

    def __init__(
        self,
        pi: float | torch.Tensor,
        sigma1: float | torch.Tensor,
        sigma2: float | torch.Tensor,
        validate_args: bool | None = None,
    ):
        self.pi, self.sigma1, self.sigma2 = torch.broadcast_tensors(
            torch.as_tensor(pi), torch.as_tensor(sigma1), torch.as_tensor(sigma2)
        )
        super().__init__(self.pi.shape, validate_args=validate_args)

    def expand(self, batch_shape: Sequence[int], _instance: Any = None) -> Any:
        batch_shape = torch.Size(batch_shape)
        return ScaleMixtureNormal(
            self.pi.expand(batch_shape),
            self.sigma1.expand(batch_shape),
            self.sigma2.expand(batch_shape),
        )

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        lp1 = dist.Normal(0.0, self.sigma1).log_prob(value) + torch.log(self.pi)
        lp2 = dist.Normal(0.0, self.sigma2).log_prob(value) + torch.log1p(-self.pi)
        return torch.logaddexp(lp1, lp2)

    @property
    def mean(self) -> torch.Tensor:
        return torch.zeros_like(self.pi)

    @property
    def variance(self) -> torch.Tensor:
        return self.pi * self.sigma1**2 + (1 - self.pi) * self.sigma2**2

    def sample(self, sample_shape: Sequence[int] = ()) -> torch.Tensor:
        shape = self._extended_shape(torch.Size(sample_shape))
        with torch.no_grad():
            first = torch.rand(shape, device=self.pi.device) < self.pi.expand(shape)
            scale = torch.where(first, self.sigma1.expand(shape), self.sigma2.expand(shape))
            return torch.randn(shape, dtype=scale.dtype, device=scale.device) * scale


class ScaleMixturePrior(Prior, builtin=True):
    """Blundell's two-component scale mixture: ``pi N(0, s1^2) + (1 - pi) N(0, s2^2)``.

    Defaults are the paper's MNIST setting (``pi = 1/2``, ``s1 = 1``, ``s2 = e^-6``). It has no
    closed-form KL to a Gaussian: ``elbo="meanfield"`` falls back to a Monte Carlo term for it.
    """

    pi: torch.Tensor  # buffers (0-d)
    sigma1: torch.Tensor
    sigma2: torch.Tensor

    def __init__(self, pi: float = 0.5, sigma1: float = 1.0, sigma2: float = math.exp(-6)):
        super().__init__()
        if not 0 < pi < 1 or sigma1 <= 0 or sigma2 <= 0:
            raise ValueError("need 0 < pi < 1 and positive sigma1, sigma2")
        self.register_buffer("pi", torch.tensor(float(pi)))
        self.register_buffer("sigma1", torch.tensor(float(sigma1)))
        self.register_buffer("sigma2", torch.tensor(float(sigma2)))

    def distribution(self, shape: torch.Size, fan_in: int) -> TorchDistribution:
        base = ScaleMixtureNormal(self.pi, self.sigma1, self.sigma2)
        return base.expand(shape).to_event(len(shape))


def from_spec(spec: dict) -> Prior:
    """The prior that :meth:`Prior.spec` describes."""
    if spec.get("class") not in BUILT_IN:
        raise ValueError(f"unknown prior {spec.get('class')!r}; known: {sorted(BUILT_IN)}")
    return BUILT_IN[spec["class"]](**spec["args"])


#: He et al.'s variance-preserving gain for ReLU layers: ``LayerwiseNormalPrior(HE_GAIN)`` is
#: ``N(0, 2 / fan_in)`` per layer, the default prior of a converted network
#: (``zoo.models.from_module``; ``benchmarks/trained_network.py prior``).
HE_GAIN = math.sqrt(2.0)
#: The gain of the regression default ``LayerwiseNormalPrior``: :data:`HE_GAIN` (README,
#: "Regression defaults", and ``benchmarks/regression.py``).
REGRESSION_GAIN = HE_GAIN


def default_prior(task: str) -> Prior:
    """The prior a model gets when it is given none.

    ``"classification"``: ``NormalPrior(1.0)`` (Blundell et al.'s and Posch & Pilz's recipes).
    ``"regression"``: ``LayerwiseNormalPrior(REGRESSION_GAIN)``, ``N(0, 2 / fan_in)``: the
    function prior keeps its size whatever the layers' widths and, through ReLU layers, their
    number; chosen on scikit-learn's regression data and the 1D toy (README, "Regression
    defaults").
    """
    if task == "regression":
        return LayerwiseNormalPrior(REGRESSION_GAIN)
    return NormalPrior(1.0)
