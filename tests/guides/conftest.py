"""Small sites of every Gaussian family with random (not initial) parameters, in float64."""

import functools

import pytest
import torch

from tests.families import GAUSSIAN, site_case

FAMILIES = list(GAUSSIAN)
SHAPES = [(4, 3), (6, 5)]


def make_site(family: str, shape, seed: int = 0, site_cls=None, options=None):
    """A site module of case ``family`` (or of ``site_cls`` with ``options``) with every
    parameter moved to a random value."""
    torch.manual_seed(seed)
    if site_cls is None:
        site_cls, options = site_case(family)
    init = (0.5 + torch.rand(shape, dtype=torch.float64)) * torch.where(
        torch.rand(shape) < 0.5, -1.0, 1.0
    ).double()
    site = site_cls(init, 0.3, **(options or {}))
    with torch.no_grad():
        for name, p in site.named_parameters():
            if "loc" in name:
                continue
            p.add_(0.3 * torch.randn_like(p))
    return site


@pytest.fixture(params=FAMILIES)
def family(request):
    return request.param


@pytest.fixture
def make(family):
    """``make(shape, seed=0)``: a random site of the case under test. The shared distribution
    tests take this, so a module can run them on another family by overriding it."""
    return functools.partial(make_site, family)


@pytest.fixture(params=SHAPES, ids=lambda s: "x".join(map(str, s)))
def shape(request):
    return request.param
