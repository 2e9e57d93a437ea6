"""Tridiagonal covariance (Posch & Pilz, "Correlated parameters to accurately measure
uncertainty in deep neural networks").

Per site the weights are flattened in row-major (C) order, ``w = vec(W)`` of length ``n``, so
element ``i`` is correlated with ``i - 1`` and ``i + 1`` only: for a linear weight of shape
``(out, in)`` neighbours are adjacent inputs of one output unit (and the last input of unit ``j``
with the first of unit ``j + 1``). ``Cov = L L^T`` with ``L`` lower bidiagonal (diagonal ``a``,
sub-diagonal ``c``), so ``Cov`` is tridiagonal and

    w_i = m_i + a_i x_i + c_{i-1} x_{i-1},    log det Cov = 2 sum_i log a_i,

both O(n) with no loop over elements.

Two parameterisations:

``"posch"``
    Two scalars per site: ``Var[w_i] = tau^2 m_i^2`` and every neighbour correlation equals
    ``rho``, ``tau = softplus(delta)``, ``rho = sigmoid(gamma) - 1/2``. The paper's recursion for
    ``a`` and ``c`` (its equations 10-13) has the closed form ``a_k = tau |m_k| sqrt(r_k)``,
    ``c_k = rho tau |m_{k+1}| / sqrt(r_k)`` with ``r_1 = 1``, ``r_{k+1} = 1 - rho^2 / r_k``, i.e.
    ``r_k = lambda_+ (1 - q^{k+1}) / (1 - q^k)``, ``lambda_pm = (1 pm sqrt(1 - 4 rho^2)) / 2``,
    ``q = lambda_- / lambda_+``, evaluated as ``expm1(-(k+1) t) / expm1(-k t)`` with
    ``t = -log q``: finite for large ``k`` and for ``|rho| -> 1/2`` (``t -> 0``, limit
    ``(k+1) / (2k)``). ``|m|`` is clamped below by ``min_abs_mean`` (no zero variance);
    ``gamma`` to ``[-10, 10]`` (``|rho| <= 0.49995``) as in the paper's algorithm.
``"free"``
    ``a = softplus(.)`` and ``c`` free, per element: ``2 n`` extra parameters.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from pyro.poutine.runtime import get_plates

from guides.base import PerSiteGuide
from guides.gaussian import StructuredGaussian
from guides.kernels import PoschSample, bidiagonal_solve
from guides.posch_joint import posch_ratios, posch_rho, share_posch_work
from guides.registry import Recipe
from guides.site import SitePosterior, SiteSpec, inverse_softplus, param


class TridiagonalNormal(StructuredGaussian):
    """``N(loc, L L^T)`` with ``L`` lower bidiagonal, over a tensor flattened row-major.

    Parameters
    ----------
    loc : Tensor
        Mean, shaped like the site.
    diag : Tensor
        ``(n,)`` positive diagonal of ``L``.
    sub : Tensor
        ``(n - 1,)`` sub-diagonal of ``L`` (``L[i + 1, i] = sub[i]``).
    """

    def __init__(
        self,
        loc: torch.Tensor,
        diag: torch.Tensor,
        sub: torch.Tensor,
        validate_args: bool | None = None,
    ):
        self.diag = diag
        self.sub = sub
        super().__init__(loc, validate_args=validate_args)

    def _deviation(self, eps):
        return self.diag * eps + F.pad(self.sub * eps[..., :-1], (1, 0))

    def _mahalanobis(self, diff):
        return bidiagonal_solve(self.diag, self.sub, diff).pow(2).sum(-1)

    def log_det_covariance(self) -> torch.Tensor:
        return 2 * self.diag.abs().log().sum()

    def _flat_variance(self):
        return self.diag.pow(2) + F.pad(self.sub.pow(2), (1, 0))

    def _dense_covariance(self):
        chol = torch.diag_embed(self.diag) + torch.diag_embed(self.sub, offset=-1)
        return chol @ chol.mT


def _extend(head: torch.Tensor, limit: torch.Tensor, n: int) -> torch.Tensor:
    """``head`` followed by ``limit`` up to length ``n``."""
    return head if n == head.shape[0] else torch.cat([head, limit.expand(n - head.shape[0])])


def posch_factors(
    mean: torch.Tensor,
    tau: torch.Tensor,
    rho: torch.Tensor,
    min_abs_mean: float = 1e-3,
    ratios: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Closed-form ``(a, c)`` of Posch & Pilz for a flat mean ``(n,)``, scalar ``tau`` and ``rho``.

    Gives ``Var[w_i] = tau^2 max(|m_i|, min_abs_mean)^2`` and neighbour correlations ``rho``.
    ``ratios`` is ``posch_ratios(rho, n, mean)`` when the caller already has it.
    """
    n = mean.shape[-1]
    m_abs = mean.abs().clamp_min(min_abs_mean)
    head, lam_plus = ratios if ratios is not None else posch_ratios(rho, n, mean)
    sqrt_r = _extend(head.sqrt(), lam_plus.sqrt(), n)
    a = tau * m_abs * sqrt_r
    c = rho * tau * m_abs[1:] / sqrt_r[:-1]
    return a, c


class PoschNormal(TridiagonalNormal):
    """The tridiagonal Gaussian of Posch & Pilz, evaluated without forming ``a`` and ``c``.

    With ``a_i = tau |m_i| sqrt(r_i)`` and ``c_{i-1} = rho tau |m_i| / sqrt(r_{i-1})`` the
    deviation factors as ``tau |m_i| (sqrt(r_i) eps_i + rho eps_{i-1} / sqrt(r_{i-1}))``, the
    variance is ``tau^2 m_i^2`` (``r_i + rho^2 / r_{i-1} = 1``) and
    ``log det Cov = 2 n log tau + 2 sum log |m_i| + sum log r_i``: a few O(n) passes per step.
    ``diag`` and ``sub`` (for the exact solve and the dense covariance) are built on demand.
    """

    def __init__(
        self,
        loc,
        tau,
        rho,
        min_abs_mean: float = 1e-3,
        validate_args=None,
        ratios=None,
        draw=None,
    ):
        self.tau, self.rho, self.min_abs_mean = tau, rho, float(min_abs_mean)
        self._m_abs: torch.Tensor | None = None
        self._factors: tuple | None = None
        self._log_m_sum: torch.Tensor | None = None
        self._log_q: torch.Tensor | None = None
        self._ratios = ratios  # posch_ratios(rho, n, loc), when the caller has them
        # (value, eps, log q, sum log |m|) of a draw made with the other sites' (posch_joint):
        # the next rsample() returns it.
        self._draw = draw
        StructuredGaussian.__init__(self, loc, validate_args=validate_args)

    def rsample(self, sample_shape: Sequence[int] = ()) -> torch.Tensor:
        if self._draw is not None and not sample_shape and not self.batch_shape:
            value, eps, self._log_q, self._log_m_sum = self._draw
            self._draw = None
            self._cache = (value, eps)
            return value
        shape = torch.Size(sample_shape) + self.batch_shape
        n = self.num_elements
        loc = self._flat_loc
        eps = torch.randn(shape + (n,), dtype=loc.dtype, device=loc.device)
        head, lam_plus = self._ratio_terms()
        value, log_m_sum = PoschSample.apply(
            loc,
            self.tau,
            self.rho,
            head.sqrt(),
            lam_plus.sqrt(),
            eps.reshape(-1, n),
            self.min_abs_mean,
        )
        if self._log_m_sum is None:
            self._log_m_sum = log_m_sum
        value = value.reshape(shape + self.event_shape)
        self._cache = (value, eps)
        return value

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        if self._log_q is not None and self._cache is not None and value is self._cache[0]:
            return self._log_q  # the joint draw's: the same value and total derivative
        return super().log_prob(value)

    @property
    def m_abs(self) -> torch.Tensor:
        if self._m_abs is None:
            self._m_abs = self._flat_loc.abs().clamp_min(self.min_abs_mean)
        return self._m_abs

    def _ratio_terms(self):
        if self._ratios is None:
            self._ratios = posch_ratios(self.rho, self.num_elements, self._flat_loc)
        return self._ratios

    def _ab(self):
        if self._factors is None:
            self._factors = posch_factors(
                self._flat_loc, self.tau, self.rho, self.min_abs_mean, self._ratio_terms()
            )
        return self._factors

    @property
    def diag(self) -> torch.Tensor:  # type: ignore[override]  # computed here, not given
        return self._ab()[0]

    @property
    def sub(self) -> torch.Tensor:  # type: ignore[override]
        return self._ab()[1]

    def log_det_covariance(self) -> torch.Tensor:
        n = self.num_elements
        head, lam_plus = self._ratio_terms()
        log_r = head.log().sum() + (n - head.shape[0]) * lam_plus.log()
        log_m = self._log_m_sum if self._log_m_sum is not None else self.m_abs.log().sum()
        return 2 * n * self.tau.log() + 2 * log_m + log_r

    def _flat_variance(self):
        return (self.tau * self.m_abs).pow(2)


class PoschSite(SitePosterior):
    """Parameters ``loc`` (per element), ``delta`` and ``gamma`` (one scalar each)."""

    family = "tridiagonal"
    MEAN_PARAMETER = "loc"  # guides.pairs
    STEP_BYTES_PER_WEIGHT = 24  # the draw, its noise and gradients, the neighbour products

    def __init__(
        self,
        init_loc: torch.Tensor,
        init_scale: float,
        init_tau: float = 0.1,
        init_rho: float = 0.0,
        min_abs_mean: float = 1e-3,
    ):
        super().__init__(init_loc, init_scale)
        if init_tau <= 0:
            raise ValueError(f"init_tau must be positive, got {init_tau}")
        if not -0.5 < init_rho < 0.5:
            raise ValueError(f"init_rho must lie in (-1/2, 1/2), got {init_rho}")
        self.min_abs_mean = float(min_abs_mean)
        self.loc = param(init_loc.detach().clone())
        self.delta = param(inverse_softplus(float(init_tau)).to(init_loc))
        self.gamma = param(torch.logit(torch.tensor(init_rho + 0.5)).to(init_loc))
        #: ``(tau, rho, posch_ratios, draw)`` computed with the other sites' during one guide
        #: call (:meth:`AutoTridiagonal.forward`); ``None`` outside it.
        self.shared: tuple | None = None

    @property
    def tau(self) -> torch.Tensor:
        return F.softplus(self.delta)

    @property
    def rho(self) -> torch.Tensor:
        return posch_rho(self.gamma)

    def distribution(self) -> PoschNormal:
        shared = getattr(self, "shared", None)
        if shared is None:
            return PoschNormal(self.loc, self.tau, self.rho, self.min_abs_mean)
        tau, rho, ratios, draw = shared
        return PoschNormal(self.loc, tau, rho, self.min_abs_mean, ratios=ratios, draw=draw)


class FreeTridiagonalSite(SitePosterior):
    """Parameters ``loc``, ``diag_rho`` (``a = softplus(diag_rho)``) and ``sub`` (free)."""

    family = "tridiagonal"
    MEAN_PARAMETER = "loc"  # guides.pairs

    def __init__(self, init_loc: torch.Tensor, init_scale: float):
        super().__init__(init_loc, init_scale)
        n = init_loc.numel()
        self.loc = param(init_loc.detach().clone())
        self.diag_rho = param(torch.full((n,), float(inverse_softplus(init_scale))).to(init_loc))
        self.sub = param(torch.zeros(max(n - 1, 0)).to(init_loc))

    @classmethod
    def guide_options(cls, options: dict) -> tuple[str, dict]:
        return cls.family, {"parameterization": "free", **options}

    def distribution(self) -> TridiagonalNormal:
        return TridiagonalNormal(self.loc, F.softplus(self.diag_rho), self.sub)


class AutoTridiagonal(PerSiteGuide, family="tridiagonal"):
    """Per-site tridiagonal Gaussian guide (Posch & Pilz), weights flattened row-major.

    Parameters
    ----------
    model : callable
        The Pyro model.
    parameterization : {"posch", "free"}
        ``"posch"``: ``Var[w_i] = tau^2 m_i^2`` and one neighbour correlation ``rho`` per site
        (``n + 2`` parameters); ``"free"``: per-element diagonal and sub-diagonal of the
        Cholesky factor (``3 n - 1`` parameters).
    init_tau : float, default 0.1
        ``"posch"`` only: initial ``tau`` (marginal standard deviation / ``|mean|``).
    init_rho : float, default 0.0
        ``"posch"`` only: initial neighbour correlation, in ``(-1/2, 1/2)``.
    min_abs_mean : float, default 1e-3
        ``"posch"`` only: ``|m|`` is clamped below by this in the variance, so a mean near zero
        cannot collapse a variance to zero (the paper re-draws such means instead).
    init_scale : float, default 0.01
        ``"free"`` only: initial standard deviation of every weight.

    Notes
    -----
    With ``"posch"`` the entropy contains ``sum_i log |m_i|``: a log barrier at zero, so a mean
    does not change sign; start from sensible signs (the default Kaiming init, ``init_module``
    or ``init_loc``). A fit from scratch that starts at a MAP fit (:mod:`zoo.training.map_start`)
    builds ``"tridiagonal"`` named without options as ``parameterization="free"``: from the
    MAP weights the entropy's ``sum_i log |m_i|`` grows every mean's magnitude, and the fit
    ends below the MAP fit it started from (``benchmarks/against_map.py``); ask for
    ``guides.family("tridiagonal", parameterization="posch")`` to fit the paper's family
    there. With far more weights than data, the barrier and the KL's ``-n log tau``
    (``n`` weights a site) outweigh the data term: the true ELBO's optimum is noisy whatever
    the rate (``benchmarks/posch_objective.py`` at ``8e6b64a``). The paper weights the KL by 1/100
    (below).

    Examples
    --------
    The paper's LeNet-5 recipe: KL down-weighted by ``nu = 1 / (N * 100)`` relative to the data
    term's per-example scale (``kl_weight = 1/100`` here, since the ELBO is already full-data),
    and the correlation parameters ``gamma`` learned 50 times faster::

        fit = zoo.fit(zoo.models.LeNet5(), "tridiagonal", mnist, lr=0.01, batch_size=64,
                      optim=zoo.Optim(optimizer="sgd", optimizer_options={"momentum": 0.9},
                                      lr_multipliers={"*.gamma*": 50.0}, per_example=True,
                                      lr_schedule=lambda i: (1 + 1e-4 * i) ** -0.75),
                      loss=zoo.Loss(kl_weight=0.01))
    """

    site_class = PoschSite
    RECIPE = Recipe(
        map_start_options={"parameterization": "free"},
        why="from the MAP weights the Posch entropy's sum log |m| inflates the means, so the "
        "fit falls behind the MAP fit it started from (benchmarks/against_map.py)",
    )
    variants = {"": {}, "free": {"parameterization": "free"}}

    def __init__(self, model: Callable, *, parameterization: str = "posch", **kwargs: Any):
        super().__init__(model, parameterization=parameterization, **kwargs)
        self.parameterization = parameterization

    def __setstate__(self, state):
        state = dict(state)
        if "options" not in state:  # pickled by an earlier version
            state["options"] = {
                "parameterization": state.get("parameterization", "posch"),
                **state.get("family_options", {}),
            }
        super().__setstate__(state)

    def share_site_work(self) -> list[PoschSite]:
        """The Posch sites' ratio sequences are computed together, and on a GPU (or a small
        network) their draws too (:func:`share_posch_work`): a few dozen small operations."""
        sites = [self.site_posterior(n) for n in self._site_names]
        posch = [s for s in sites if isinstance(s, PoschSite)]
        groups: dict[float, list[PoschSite]] = {}
        for site in posch:
            groups.setdefault(site.min_abs_mean, []).append(site)
        layouts = self.__dict__.setdefault("_posch_layouts", {})
        # under an enclosing plate (vectorised particles) a joint draw would be thrown away
        joint = False if get_plates() else None
        for min_abs_mean, group in groups.items():
            share_posch_work(group, min_abs_mean, layouts, joint)
        return posch

    @classmethod
    def site_spec(cls, parameterization: str = "posch", **options: Any) -> SiteSpec:
        if parameterization == "posch":
            return PoschSite, options
        if parameterization == "free":
            for key in ("init_tau", "init_rho", "min_abs_mean"):
                if key in options:
                    raise ValueError(f"{key} applies to parameterization='posch' only")
            return FreeTridiagonalSite, options
        raise ValueError(f"parameterization must be 'posch' or 'free', got {parameterization!r}")
