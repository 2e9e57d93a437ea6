"""Small sites of every family with random (not initial) parameters, in float64."""

import pytest
import torch

from guides.diagonal import DiagonalSite
from guides.lowrank import LowRankSite
from guides.matrix_normal import MatrixNormalSite
from guides.tridiagonal import FreeTridiagonalSite, PoschSite

FAMILIES = {
    "diagonal": (DiagonalSite, {}),
    "lowrank": (LowRankSite, {"rank": 2}),
    "lowrank_constant": (LowRankSite, {"rank": 2, "diagonal": "constant"}),
    "tridiagonal_free": (FreeTridiagonalSite, {}),
    "tridiagonal_posch": (PoschSite, {"init_tau": 0.6, "init_rho": 0.3}),
    "matrix_normal": (MatrixNormalSite, {}),
    "matrix_normal_diag_rows": (MatrixNormalSite, {"row": "diagonal"}),
    "matrix_normal_diag_cols": (MatrixNormalSite, {"col": "diagonal"}),
}
SHAPES = [(4, 3), (6, 5)]


def make_site(family: str, shape, seed: int = 0):
    """A site module of ``family`` with every parameter moved to a random value."""
    torch.manual_seed(seed)
    cls, options = FAMILIES[family]
    init = (0.5 + torch.rand(shape, dtype=torch.float64)) * torch.where(
        torch.rand(shape) < 0.5, -1.0, 1.0
    ).double()
    site = cls(init, 0.3, **options)
    with torch.no_grad():
        for name, p in site.named_parameters():
            if "loc" in name:
                continue
            p.add_(0.3 * torch.randn_like(p))
    return site


@pytest.fixture(params=list(FAMILIES))
def family(request):
    return request.param


@pytest.fixture(params=SHAPES, ids=lambda s: "x".join(map(str, s)))
def shape(request):
    return request.param
