"""Weight priors. Each prior is an ``nn.Module`` whose numbers are buffers, so ``model.to(device)``
moves them with the model and every prior sample is drawn on the model's device.

A prior returns, per site, a distribution whose event shape is the whole weight tensor:
``prior.distribution(shape, fan_in)``.
"""

from __future__ import annotations

import math

import pyro.distributions as dist
import torch
from pyro.distributions import TorchDistribution
from torch import nn
from torch.distributions import constraints
from torch.distributions.kl import register_kl

from guides.gaussian import DiagonalNormal, StructuredGaussian, expand_to, gaussian_kl
from guides.kernels import squared_norm
from guides.mc_dropout import MCDropoutWeight, dropout_kl


class IsotropicNormal(TorchDistribution):
    """``N(loc, scale^2 I)`` over a whole tensor of shape ``event_shape`` (scalar ``loc`` and
    ``scale``). The same density as ``Normal(loc, scale).expand(shape).to_event(k)``, with a
    fused ``log_prob``: one reduction instead of a tensor of elementwise terms."""

    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}
    has_rsample = True

    def __init__(
        self, loc, scale, event_shape, batch_shape=(), validate_args=None, zero_loc: bool = False
    ):
        self.loc, self.scale = torch.as_tensor(loc), torch.as_tensor(scale)
        # Known at construction (no device sync): log_prob then skips ``value - loc``.
        self.zero_loc = bool(zero_loc)
        super().__init__(torch.Size(batch_shape), torch.Size(event_shape), validate_args)

    @property
    def support(self):
        return constraints.independent(constraints.real, len(self.event_shape))

    def expand(self, batch_shape, _instance=None):
        return IsotropicNormal(
            self.loc, self.scale, self.event_shape, batch_shape, zero_loc=self.zero_loc
        )

    @property
    def mean(self):
        return self.loc.expand(self.batch_shape + self.event_shape)

    @property
    def variance(self):
        return self.scale.pow(2).expand(self.batch_shape + self.event_shape)

    def rsample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        return self.loc + self.scale * torch.randn(
            shape, dtype=self.scale.dtype, device=self.scale.device
        )

    def log_prob(self, value):
        k = len(self.event_shape)
        n = math.prod(self.event_shape)
        diff = value if self.zero_loc else value - self.loc
        sq = squared_norm(diff.reshape(value.shape[: value.dim() - k] + (-1,)))
        lp = -0.5 * sq / self.scale.pow(2) - n * (self.scale.log() + 0.5 * math.log(2 * math.pi))
        return expand_to(lp, self.batch_shape)


@register_kl(StructuredGaussian, IsotropicNormal)
@register_kl(DiagonalNormal, IsotropicNormal)
def _kl_gaussian_isotropic(q, p):
    if q.event_shape != p.event_shape:
        raise NotImplementedError
    return gaussian_kl(q, p.loc, p.scale, p.batch_shape)


@register_kl(MCDropoutWeight, IsotropicNormal)
def _kl_dropout_isotropic(q, p):
    if q.event_shape != p.event_shape:
        raise NotImplementedError
    return dropout_kl(q, p.loc, p.scale, p.batch_shape)


class Prior(nn.Module):
    """Base class: ``distribution(shape, fan_in)`` -> a distribution with event shape ``shape``."""

    def distribution(self, shape: torch.Size, fan_in: int) -> TorchDistribution:
        """The prior of a site of this ``shape`` whose layer has this ``fan_in``."""
        raise NotImplementedError

    def spec(self) -> dict | None:
        """Plain data that rebuilds this prior (:func:`from_spec`), or ``None`` for a prior
        class of the user's."""
        args = {name: float(buffer) for name, buffer in self.named_buffers()}
        return {"class": type(self).__name__, "args": args} if type(self) in _BUILT_IN else None


class NormalPrior(Prior):
    """Isotropic ``N(loc, scale^2)`` on every weight; ``scale`` is a standard deviation."""

    _zero_loc = False  # set per instance; the class default serves priors pickled before it

    def __init__(self, scale: float = 1.0, loc: float = 0.0):
        super().__init__()
        if scale <= 0:
            raise ValueError(f"prior scale must be positive, got {scale}")
        self.register_buffer("loc", torch.tensor(float(loc)))
        self.register_buffer("scale", torch.tensor(float(scale)))
        self._zero_loc = float(loc) == 0.0

    def distribution(self, shape, fan_in):
        return IsotropicNormal(self.loc, self.scale, shape, zero_loc=self._zero_loc)

    def extra_repr(self) -> str:
        return f"loc={self.loc.item():g}, scale={self.scale.item():g}"


class LayerwiseNormalPrior(Prior):
    """``N(0, gain^2 / fan_in)`` per layer (a bias uses its layer's fan-in)."""

    def __init__(self, gain: float = 1.0):
        super().__init__()
        if gain <= 0:
            raise ValueError(f"gain must be positive, got {gain}")
        self.register_buffer("gain", torch.tensor(float(gain)))

    def distribution(self, shape, fan_in):
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

    def __init__(self, pi, sigma1, sigma2, validate_args=None):
        self.pi, self.sigma1, self.sigma2 = torch.broadcast_tensors(
            torch.as_tensor(pi), torch.as_tensor(sigma1), torch.as_tensor(sigma2)
        )
        super().__init__(self.pi.shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        batch_shape = torch.Size(batch_shape)
        return ScaleMixtureNormal(
            self.pi.expand(batch_shape),
            self.sigma1.expand(batch_shape),
            self.sigma2.expand(batch_shape),
        )

    def log_prob(self, value):
        lp1 = dist.Normal(0.0, self.sigma1).log_prob(value) + torch.log(self.pi)
        lp2 = dist.Normal(0.0, self.sigma2).log_prob(value) + torch.log1p(-self.pi)
        return torch.logaddexp(lp1, lp2)

    @property
    def mean(self):
        return torch.zeros_like(self.pi)

    @property
    def variance(self):
        return self.pi * self.sigma1**2 + (1 - self.pi) * self.sigma2**2

    def sample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        with torch.no_grad():
            first = torch.rand(shape, device=self.pi.device) < self.pi.expand(shape)
            scale = torch.where(first, self.sigma1.expand(shape), self.sigma2.expand(shape))
            return torch.randn(shape, dtype=scale.dtype, device=scale.device) * scale


class ScaleMixturePrior(Prior):
    """Blundell's two-component scale mixture: ``pi N(0, s1^2) + (1 - pi) N(0, s2^2)``.

    Defaults are the paper's MNIST setting (``pi = 1/2``, ``s1 = 1``, ``s2 = e^-6``). It has no
    closed-form KL to a Gaussian: ``elbo="meanfield"`` falls back to a Monte Carlo term for it.
    """

    def __init__(self, pi: float = 0.5, sigma1: float = 1.0, sigma2: float = math.exp(-6)):
        super().__init__()
        if not 0 < pi < 1 or sigma1 <= 0 or sigma2 <= 0:
            raise ValueError("need 0 < pi < 1 and positive sigma1, sigma2")
        self.register_buffer("pi", torch.tensor(float(pi)))
        self.register_buffer("sigma1", torch.tensor(float(sigma1)))
        self.register_buffer("sigma2", torch.tensor(float(sigma2)))

    def distribution(self, shape, fan_in):
        base = ScaleMixtureNormal(self.pi, self.sigma1, self.sigma2)
        return base.expand(shape).to_event(len(shape))


_BUILT_IN = (NormalPrior, LayerwiseNormalPrior, ScaleMixturePrior)


def from_spec(spec: dict) -> Prior:
    """The prior that :meth:`Prior.spec` describes."""
    classes = {cls.__name__: cls for cls in _BUILT_IN}
    if spec.get("class") not in classes:
        raise ValueError(f"unknown prior {spec.get('class')!r}; known: {sorted(classes)}")
    return classes[spec["class"]](**spec["args"])


def resolve_prior(prior: Prior | float | None) -> Prior:
    """``None`` -> ``NormalPrior(1.0)``; a number -> ``NormalPrior(number)``; a Prior as is."""
    if prior is None:
        return NormalPrior(1.0)
    if isinstance(prior, Prior):
        return prior
    if isinstance(prior, (int, float)):
        return NormalPrior(float(prior))
    raise TypeError(f"prior must be a zoo.priors.Prior or a positive number, got {prior!r}")
