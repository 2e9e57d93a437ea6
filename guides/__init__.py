"""Posterior families for Bayesian neural networks in Pyro, one ``AutoGuide`` per family.

Every family works per sample site (like ``pyro.infer.autoguide.AutoNormal``) and emits a
Gaussian over each weight tensor, flattened in row-major order:

==================  =======================================  ===================================
name                class                                    covariance per site
==================  =======================================  ===================================
``diagonal``        :class:`AutoDiagonal`                    ``diag(s^2)`` (Bayes by Backprop)
``lowrank``         :class:`AutoLowRank`                     ``D^2 + F F^T``, ``F`` is ``n x r``
``tridiagonal``     :class:`AutoTridiagonal`                 ``L L^T``, ``L`` lower bidiagonal
``matrix_normal``   :class:`AutoMatrixNormal`                ``(A A^T) kron (B B^T)``
==================  =======================================  ===================================

:class:`AutoMixed` picks a family per site by name pattern. A family registers itself by its
class statement, ``class AutoX(PerSiteGuide, family="x")`` (see :mod:`guides.registry`);
:func:`available` lists the registered names.

Modules, each importing only those above it: ``kernels`` (custom autograd kernels) ->
``gaussian`` (the emitted distributions, closed-form KL) -> ``site`` (one site's parameters)
-> ``base`` (the per-site guide) -> one module per family -> ``mixed``.
"""

from guides.base import PerSiteGuide
from guides.diagonal import AutoDiagonal
from guides.gaussian import DiagonalNormal, StructuredGaussian, gaussian_kl_to_normal
from guides.lowrank import AutoLowRank, LowRankNormal
from guides.matrix_normal import AutoMatrixNormal, MatrixNormal
from guides.mixed import AutoMixed
from guides.registry import available, build, families, get
from guides.site import SitePosterior
from guides.tridiagonal import AutoTridiagonal, TridiagonalNormal

__all__ = [
    "AutoDiagonal",
    "AutoLowRank",
    "AutoMatrixNormal",
    "AutoMixed",
    "AutoTridiagonal",
    "DiagonalNormal",
    "LowRankNormal",
    "MatrixNormal",
    "PerSiteGuide",
    "SitePosterior",
    "StructuredGaussian",
    "TridiagonalNormal",
    "available",
    "build",
    "families",
    "gaussian_kl_to_normal",
    "get",
]
