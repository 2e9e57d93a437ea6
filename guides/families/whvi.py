"""Walsh-Hadamard variational inference (WHVI; Rossi, Marmin & Filippone, NeurIPS 2020).

A weight read as a matrix ``out x n`` (a convolution kernel ``(out, in, kh, kw)`` as
``out x (in kh kw)``) is built from a grid of ``K = ceil(out / D) ceil(n / D)`` blocks of size
``D x D``, each

    W_k = S1_k H diag(g_k) H S2_k / D,    g_k ~ q(g_k) = N(mu_k, L_k L_k^T),

``D`` the family's ``block_size`` (:data:`DEFAULT_BLOCK_SIZE`), at most ``2^ceil(log2 n)``;
``block_size=None`` is the paper's layout, one block as wide as the weight
(``D = 2^ceil(log2 n)``, ``K = ceil(out / D)``). The block size is the family's capacity: a
block's mean has ``D`` numbers ``g`` for ``D^2`` weights, beside the scales ``S1`` (one a row)
and ``S2`` (one a column for each row of blocks), so the paper's blocks give a 64 x 64 layer 192
numbers for its 4,096 weights' means; blocks of 4 give it 2,112 (1,024 ``g``, 64 ``S1``, 1,024
``S2``), and with the 10 numbers of each block's full ``q(g)`` about one number per weight in
all (the diagonal family has two).
``benchmarks/README.md`` at ``91a332b`` ("WHVI's blocks") measures the choice.

``H`` the Walsh-Hadamard matrix (``H / sqrt(D)`` is orthonormal, so ``g = 1`` gives the identity),
``S1``, ``S2`` diagonal, the padding sliced off (see
:class:`guides.walsh_hadamard.WalshHadamardLayout`). ``vec(W)`` is Gaussian with a covariance of
rank ``K D`` correlating the weights of each block (the whole matrix, with the paper's
blocks); each draw costs one fast transform per block and one gather,
``O(K D log D + out n)``. With ``zoo.Loss(estimator="local")`` a linear layer never forms
``W``: each example draws its own ``g`` and its output is ``s1 * H (g * H (s2 * x)) / D`` per
block, the paper's fast product, ``O(K D log D)`` per example plus the product with ``L``.

**The model the ELBO bounds.** ``q`` has no density on the weights, so the prior and the KL live
on ``g`` as the paper has them: at a site this family serves, the model's weight is
``S1 H diag(g) H S2 / D`` with ``g ~ N(0, I)``, and ``S1`` and ``S2`` (one number per row, one
per column of each row of blocks) are hyperparameters of that prior, optimised with the ELBO
(type-II maximum likelihood; ``learn_scales=False`` fixes them at one, and the prior on ``W``
is then ``N(0, 1/D)`` per entry, ``D`` the block's width: the padded fan-in with the paper's
blocks). The model's own prior at the site is cancelled exactly: the emitted distribution's
``log_prob`` adds the model's ``log p(W)`` to ``log q(g) - log p(g)``, so ``Trace_ELBO`` (and
``zoo.fit``) estimate

    ELBO = E_q[log p(y | W)] - sum_sites KL(q(g) || N(0, I)) - KL of the other sites,

and ``TraceMeanField_ELBO`` uses that KL in closed form. That needs the model's prior at the site
to be fixed: a prior with learned or sampled scales (type-II or hierarchical) is refused when the
guide is set up. Sites of fewer than two dimensions (biases) take the diagonal family.

Parameters per site: ``mu`` and ``d`` (``K D`` each), ``K D (D - 1) / 2`` for the full ``L``
(``covariance="full"``, the paper's) or none (``"diagonal"``, its ``O(D)`` variant), ``S1``
(``out``) and ``S2`` (``ceil(out / D) n``: the columns' scales of each row of blocks). A
full ``L`` is refused above ``D = 4,096``.

Initialisation: ``mu_k = diag(H B_k H) / sqrt(D f)`` for ``B_k`` block ``k`` of the initial
weight (zero-padded; ``f`` the share of the blocks it fills): the diagonal of its projection onto
the family's span, scaled so that a weight with independent entries of standard deviation ``s``
gives a mean with entries of about the same standard deviation (the mean is not the initial
weight, which the family cannot represent in general); ``d = init_scale sqrt(D)`` (each
weight's initial standard deviation is about ``init_scale``); ``L`` diagonal; ``S1 = S2 = 1``.

Parameterisation: each weight entry is a sum of ``D`` terms ``+-mu_m / D``, so a step of
``delta`` in every ``mu_m`` moves a weight by about ``delta / sqrt(D)``, and a step in ``S1`` or
``S2`` (about one) moves it by ``delta`` times the weight, about ``delta / sqrt(n)`` for an
initial weight of the fan-in's scale. Adam moves every stored number by about its rate per
step, so the family stores ``mu / sqrt(D)`` (``mean_g``) and ``S1 / sqrt(n)``, ``S2 / sqrt(n)``
(``row_scale``, ``column_scale``): a step then moves the weights about as far as a step of the
diagonal family moves its means, and the family learns at the task's rates
(``benchmarks/fairness.py`` at ``cc5a66b``). The distribution, the prior and the ELBO are unchanged.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.distributions import Distribution

from guides.base import PerSiteGuide
from guides.checks import InvalidArgument, check_bool, check_choice, is_int
from guides.registry import Recipe
from guides.site import (
    DiagonalSite,
    SitePosterior,
    SiteSpec,
    inverse_softplus,
    param,
    register_strict_lower,
    unit_lower_triangular,
)
from guides.walsh_hadamard import (
    DENSE_MAX,
    WalshHadamardLayout,
    WalshHadamardWeight,
    fwht,
    hadamard,
)

__all__ = ["AutoWHVI", "WHVISite", "WalshHadamardWeight"]

#: The largest block a full covariance of ``g`` takes: its factor has ``D^2`` entries per block.
FULL_MAX = 4096
#: The family's default block size (``block_size``), chosen on ``benchmarks/fairness.py`` at
#: ``cc5a66b``'s
#: problems (``benchmarks/README.md`` at ``91a332b``); ``None`` is the paper's, one block as wide
#: as the weight.
DEFAULT_BLOCK_SIZE: int | None = 4
COVARIANCES = ("full", "diagonal")


class WHVISite(SitePosterior):
    """The WHVI parameters of one weight site (see the module docstring)."""

    family = "whvi"
    fallback = DiagonalSite
    #: The guide hands this site the model's prior at it (``prior=``), which it cancels.
    reads_prior = True

    def __init__(
        self,
        init_loc: torch.Tensor,
        init_scale: float,
        covariance: str = "full",
        learn_scales: bool = True,
        block_size: int | None = DEFAULT_BLOCK_SIZE,
        prior: Distribution | None = None,
    ):
        super().__init__(init_loc, init_scale)
        if covariance not in COVARIANCES:
            raise ValueError(f"covariance must be one of {COVARIANCES}, got {covariance!r}")
        check_block_size(block_size)
        layout = WalshHadamardLayout(init_loc.shape, init_loc.device, block_size)
        k, d = layout.blocks, layout.size
        if covariance == "full" and d > FULL_MAX:
            raise ValueError(
                f"a WHVI weight of shape {tuple(init_loc.shape)} has blocks of D = {d} (the next "
                f"power of two of {layout.cols} columns) and a full covariance of g would hold "
                f"{k} x {d} x {d} numbers; the limit is D = {FULL_MAX}: pass "
                f"covariance='diagonal', or block_size={FULL_MAX} or less"
            )
        self.covariance, self.prior = covariance, prior
        self.register_buffer("gather", layout.gather, persistent=False)
        self.register_buffer("block", layout.block, persistent=False)
        self.layout = layout.on(None, None)  # its index tensors live in the buffers above
        dense = hadamard(d, init_loc.dtype, init_loc.device) if d <= DENSE_MAX else None
        self.register_buffer("dense", dense, persistent=False)
        like = init_loc.detach()
        # Stored in units in which one Adam step moves the weights as far as it moves a
        # diagonal mean (see "Parameterisation" in the module docstring).
        self.loc_unit, self.scale_unit = math.sqrt(d), math.sqrt(layout.cols)
        self.mean_g = param(initial_mean(like, layout) / self.loc_unit)  # indices still held
        start = float(inverse_softplus(init_scale * math.sqrt(d)))
        self.rho = param(torch.full((k, d), start, dtype=like.dtype, device=like.device))
        if covariance == "full":  # the strictly lower triangle of each block's U, row by row
            register_strict_lower(self, d, like.device)
            self.lower = param(like.new_zeros(k, d * (d - 1) // 2))
        s1, s2 = like.new_ones(layout.out), like.new_ones(layout.row_blocks, layout.cols)
        if learn_scales:
            self.row_scale = param(s1 / self.scale_unit)
            self.column_scale = param(s2 / self.scale_unit)
        else:
            self.register_buffer("row_scale", s1 / self.scale_unit)
            self.register_buffer("column_scale", s2 / self.scale_unit)

    @classmethod
    def supports(cls, shape: torch.Size) -> bool:
        return len(shape) >= 2

    #: Bytes a step holds per number of the weight it generates (its rows times its columns
    #: padded to blocks of ``D``: ``S1 H diag(g) H S2`` and its gradients) where ``H`` is a
    #: dense product (``D <= DENSE_MAX``); with the butterfly's ``log2 D`` stages, about
    #: :attr:`STEP_BYTES_PER_STAGE` a stage.
    STEP_BYTES_PER_GENERATED = 36
    STEP_BYTES_PER_STAGE = 4.5

    @classmethod
    def step_bytes(cls, shape: tuple[int, ...], options: dict) -> int:
        block_size = options.get("block_size", DEFAULT_BLOCK_SIZE)
        layout = WalshHadamardLayout(torch.Size(shape), torch.device("meta"), block_size)
        d = layout.size
        generated = shape[0] * math.ceil(math.prod(shape[1:]) / d) * d
        per = cls.STEP_BYTES_PER_GENERATED
        if d > DENSE_MAX:
            per = math.ceil(cls.STEP_BYTES_PER_STAGE * math.log2(d))
        return generated * per

    @property
    def loc(self) -> torch.Tensor:
        """The mean of ``g``, ``(K, D)``."""
        return self.mean_g * self.loc_unit

    @property
    def s1(self) -> torch.Tensor:
        """``S1``, one scale per row (``out``)."""
        return self.row_scale * self.scale_unit

    @property
    def s2(self) -> torch.Tensor:
        """``S2``, one scale per column of each row of blocks (``row_blocks x n``)."""
        return self.column_scale * self.scale_unit

    def upgrade_state(self, state: dict, prefix: str) -> None:
        """A WHVI site saved before the parameterisation in units (the ``loc``, ``s1`` and
        ``s2`` of release 0.3, learned or fixed) is rewritten in them."""
        renames = {
            "loc_unconstrained": ("mean_g_unconstrained", self.loc_unit),
            "s1_unconstrained": ("row_scale_unconstrained", self.scale_unit),
            "s2_unconstrained": ("column_scale_unconstrained", self.scale_unit),
            "s1": ("row_scale", self.scale_unit),
            "s2": ("column_scale", self.scale_unit),
        }
        if prefix + "mean_g_unconstrained" in state:
            return
        for old, (new, unit) in renames.items():
            value = state.pop(prefix + old, None)
            if value is not None:
                state[prefix + new] = value / unit

    def _apply(self, fn, recurse=True):
        """``.to(device)``, ``.double()``, ...: the model's prior at the site moves along."""
        out = super()._apply(fn, recurse)
        if self.prior is not None:
            self.prior = moved(self.prior, fn)
        return out

    def unit(self) -> torch.Tensor | None:
        """``U`` per block, ``(K, D, D)`` unit lower-triangular (``None`` for a diagonal ``q``)."""
        if self.covariance != "full":
            return None
        return unit_lower_triangular(self.lower, self.rows, self.cols, self.rho.shape[-1])

    def distribution(self) -> WalshHadamardWeight:
        layout = self.layout.on(self.gather, self.block)
        scale = F.softplus(self.rho)
        return WalshHadamardWeight(
            layout, self.loc, scale, self.unit(), self.s1, self.s2, self.prior, self.dense
        )


def check_block_size(block_size) -> None:
    """``block_size``: ``None`` (the paper's blocks, one wide) or a power of two of at least 2."""
    if block_size is None:
        return
    if not is_int(block_size) or block_size < 2 or block_size & (block_size - 1):
        raise InvalidArgument(
            f"block_size must be None (blocks as wide as the weight, the paper's) or a power of "
            f"two of at least 2 (16, 64, ...), got {block_size!r}"
        )


def moved(distribution: Distribution, fn) -> Distribution:
    """A shallow copy of ``distribution`` with ``fn`` applied to every tensor it holds, its
    base distributions' included (what ``nn.Module._apply`` does to a module's tensors)."""
    new = copy.copy(distribution)
    for key, value in vars(distribution).items():
        if torch.is_tensor(value):
            setattr(new, key, fn(value))
        elif isinstance(value, Distribution):
            setattr(new, key, moved(value, fn))
    return new


def initial_mean(weight: torch.Tensor, layout: WalshHadamardLayout) -> torch.Tensor:
    """``mu_k = diag(H B_k H) / sqrt(D f)`` for the zero-padded blocks ``B_k`` of ``weight``,
    ``f`` the share of the blocks' entries that the weight fills. Since
    ``diag(H B H)_k = (H c)_k`` with ``c_m`` the sum of the entries ``B_ij`` with ``i XOR j = m``,
    it costs one scatter-add of the weight and one transform per block, no padded block."""
    k, d = layout.blocks, layout.size
    sums = weight.new_zeros(k * d).index_add_(0, layout.gather.reshape(-1), weight.reshape(-1))
    filled = layout.out * layout.cols / (k * d * d)
    return fwht(sums.reshape(k, d)) / math.sqrt(d * filled)


class AutoWHVI(PerSiteGuide, family="whvi"):
    """Walsh-Hadamard variational inference: each weight ``S1 H diag(g) H S2 / D`` per block,
    ``g`` Gaussian with a full (or diagonal) covariance; biases diagonal.

    The family carries its own prior on ``g`` (``N(0, I)``) and cancels the model's prior at the
    sites it serves: read the module docstring for the model whose ELBO it bounds.

    Parameters
    ----------
    model : callable
        The Pyro model; its prior at every weight site must be fixed (no learned or sampled
        scales).
    covariance : {"full", "diagonal"}, default "full"
        ``q(g)``'s covariance per block: a Cholesky factor (the paper's) or its diagonal.
    learn_scales : bool, default True
        Optimise ``S1`` and ``S2`` with the ELBO (the paper); ``False`` fixes them at one.
    block_size : int or None, default :data:`DEFAULT_BLOCK_SIZE`
        ``D``, the side of the blocks a weight is cut into (a power of two; at most the next
        power of two of the weight's columns), each block with its own ``g``: the family's
        capacity. A ``D x D`` block has ``3 D`` numbers for its mean (``g``, ``S1``, ``S2``)
        for ``D^2`` weights, and ``D (D + 1) / 2`` for a full covariance of ``g``: ``None``
        (the paper's, one block as wide as the weight) has the fewest numbers per weight
        and the least capacity on small layers; smaller blocks learn more of the data.
    init_scale : float, default 0.01
        About the initial standard deviation of every weight.
    init_loc_fn, init_module, create_plates
        See :class:`guides.base.PerSiteGuide`; given weights (a callable ``init_loc_fn``, an
        ``init_module``) are refused: no WHVI mean takes them, and a converted trained
        network's weights (the ``"auto"`` default's) are not used either.
    """

    RECIPE = Recipe(
        lr_scale=3.0,
        full_batch_lr_scale=1.0,
        why="in units of one step (the module's Parameterisation) its minibatch fits are still "
        "best from three times the task's rate (MNIST's LeNet-5, blocks of 4); the full-batch "
        "recipe's 1e-2 is near its best, and three times it diverges on the toy "
        "(benchmarks/fairness.py at cc5a66b)",
    )

    site_class = WHVISite
    STARTS_AT_WEIGHTS = False  # its own draw, projected: no weight is a mean it can take
    variants = {"": {}, "diagonal": {"covariance": "diagonal"}, "paper": {"block_size": None}}
    OBJECTIVE = "whvi_model"  # its own N(0, I) prior on g and learned scales

    def __init__(
        self,
        model: Callable,
        *,
        init_loc_fn: str | Callable = "auto",
        init_module: torch.nn.Module | None = None,
        **options: Any,
    ):
        if callable(init_loc_fn) or init_module is not None:
            raise ValueError(
                "AutoWHVI cannot start at given weights: its mean S1 H diag(g) H S2 / D spans "
                "D of the D x D numbers of each block, so a weight you give is not a mean it "
                "can take (Pyro's contract: start at the given values, or refuse). It starts "
                "from its own Kaiming draw, projected: leave init_loc_fn and init_module out, "
                "or fit another family (guides.available()) from those weights"
            )
        # "auto" too starts from its own draw: a trained network's weights are no WHVI mean
        super().__init__(model, init_loc_fn="kaiming", **options)

    @classmethod
    def site_spec(cls, **options: Any) -> SiteSpec:
        """The site class and options, ``covariance``, ``learn_scales`` and ``block_size``
        checked when the guide is built (``learn_scales="no"`` is refused, not read as true)."""
        check_choice("covariance", options.get("covariance", "full"), COVARIANCES)
        check_bool(learn_scales=options.get("learn_scales", True))
        options = cls.saved_options(options)
        check_block_size(options["block_size"])
        return super().site_spec(**options)

    @classmethod
    def saved_options(cls, options: dict) -> dict:
        """The options with the block size, which decides the parameters' shapes."""
        return {"block_size": DEFAULT_BLOCK_SIZE, **options}

    @classmethod
    def read_options(cls, options: dict) -> dict:
        """A saved spec's options: one written before ``block_size`` existed has the paper's
        blocks."""
        return {"block_size": None, **options}
