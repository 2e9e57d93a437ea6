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

:class:`AutoMixed` picks a family per site by name pattern. A family is one module of
:mod:`guides.families` and registers itself by its class statement, ``class AutoX(PerSiteGuide,
family="x")`` (see :mod:`guides.registry`); :func:`available` lists the registered names and
:func:`guides.registry.families` their classes.

Modules, each importing only those above it: ``kernels`` (custom autograd kernels) ->
``gaussian`` (the emitted distributions, closed-form KL) -> ``site`` (one site's parameters)
-> ``base`` (the per-site guide) -> one module per family in :mod:`guides.families` (``mixed``
last).
"""

import sys as _sys

import guides.families
from guides.base import PerSiteGuide
from guides.families.block_diagonal import AutoBlockDiagonal, BlockDiagonalNormal
from guides.families.diagonal import AutoDiagonal
from guides.families.joint import AutoJoint
from guides.families.lowrank import AutoLowRank, LowRankNormal
from guides.families.matrix_normal import AutoMatrixNormal, MatrixNormal
from guides.families.mc_dropout import AutoMCDropout, MCDropoutWeight
from guides.families.mixed import AutoMixed
from guides.families.point_mass import AutoMAP, PointMass
from guides.families.subnetwork import AutoSubnetwork
from guides.families.tridiagonal import AutoTridiagonal, TridiagonalNormal
from guides.families.whvi import AutoWHVI
from guides.gaussian import DiagonalNormal, StructuredGaussian, gaussian_kl_to_normal
from guides.pairs import MeanScale, mean_scale_pairs
from guides.registry import (
    Family,
    Recipe,
    available,
    build,
    family,
    get,
    instantiate,
    recipe,
)
from guides.site import SitePosterior
from guides.walsh_hadamard import WalshHadamardWeight

guides.families.alias_old_paths(_sys.modules[__name__])

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
    "gaussian_kl_to_normal",
    "get",
    "instantiate",
    "mean_scale_pairs",
    "recipe",
]
