"""Posterior families for Bayesian neural networks in Pyro, one ``AutoGuide`` per family.

Every family works per sample site (like ``pyro.infer.autoguide.AutoNormal``) and emits a
distribution over each weight tensor (the Gaussians' covariances are over the tensor flattened in
row-major order); MC dropout and the point mass are the source papers' baselines:

===================  =======================================  ==================================
name                 class                                    ``q`` per site
===================  =======================================  ==================================
``diagonal``         :class:`AutoDiagonal`                    ``N(m, diag(s^2))`` (Bayes by
                                                              Backprop)
``lowrank``          :class:`AutoLowRank`                     ``N(m, D^2 + F F^T)``, ``F`` n x r
``tridiagonal``      :class:`AutoTridiagonal`                 ``N(m, L L^T)``, ``L`` bidiagonal
``matrix_normal``    :class:`AutoMatrixNormal`                ``N(m, (A A^T) kron (B B^T))``
``block_diagonal``   :class:`AutoBlockDiagonal`               ``N(m, blockdiag(L_k L_k^T))``
``mc_dropout``       :class:`AutoMCDropout`                   ``M diag(z) + sigma E`` (Gal)
``map``              :class:`AutoMAP`                         point mass ``delta(w - m)``
``whvi``             :class:`AutoWHVI`                        ``S1 H diag(g) H S2 / D`` per block,
                                                              ``g ~ N(mu, L L^T)`` (its own
                                                              prior on ``g``)
``subnetwork``       :class:`AutoSubnetwork`                  one full Gaussian over ``S`` chosen
                                                              weights, point masses elsewhere
===================  =======================================  ==================================

:class:`AutoMixed` picks a family per site by name pattern. A family registers itself by its
class statement, ``class AutoX(PerSiteGuide, family="x")`` (see :mod:`guides.registry`);
:func:`available` lists the registered names.

Modules, each importing only those above it: ``kernels`` (custom autograd kernels) ->
``gaussian`` (the emitted distributions, closed-form KL) -> ``site`` (one site's parameters)
-> ``base`` (the per-site guide) -> one module per family -> ``mixed``.
"""

from guides.base import PerSiteGuide
from guides.block_diagonal import AutoBlockDiagonal, BlockDiagonalNormal
from guides.diagonal import AutoDiagonal
from guides.gaussian import DiagonalNormal, StructuredGaussian, gaussian_kl_to_normal
from guides.joint import AutoJoint
from guides.lowrank import AutoLowRank, LowRankNormal
from guides.matrix_normal import AutoMatrixNormal, MatrixNormal
from guides.mc_dropout import AutoMCDropout, MCDropoutWeight
from guides.mixed import AutoMixed
from guides.pairs import MeanScale, mean_scale_pairs
from guides.point_mass import AutoMAP, PointMass
from guides.registry import (
    Family,
    Recipe,
    available,
    build,
    families,
    family,
    get,
    instantiate,
    recipe,
)
from guides.site import SitePosterior
from guides.subnetwork import AutoSubnetwork
from guides.tridiagonal import AutoTridiagonal, TridiagonalNormal
from guides.walsh_hadamard import WalshHadamardWeight
from guides.whvi import AutoWHVI

__all__ = [
    "Family",
    "family",
    "AutoBlockDiagonal",
    "AutoDiagonal",
    "AutoJoint",
    "AutoLowRank",
    "AutoMAP",
    "AutoMCDropout",
    "AutoMatrixNormal",
    "AutoMixed",
    "AutoSubnetwork",
    "AutoTridiagonal",
    "AutoWHVI",
    "BlockDiagonalNormal",
    "DiagonalNormal",
    "LowRankNormal",
    "MCDropoutWeight",
    "MatrixNormal",
    "MeanScale",
    "PerSiteGuide",
    "PointMass",
    "Recipe",
    "SitePosterior",
    "StructuredGaussian",
    "TridiagonalNormal",
    "WalshHadamardWeight",
    "available",
    "build",
    "families",
    "gaussian_kl_to_normal",
    "get",
    "instantiate",
    "mean_scale_pairs",
    "recipe",
]
