"""Every Gaussian family on Bayesian linear regression with strongly correlated inputs, against the
exact posterior and the exact ELBO of the fitted Gaussian."""

import pytest
import torch

import guides
import zoo
from tests.families import GAUSSIAN, PRIMARY
from tests.zoo.linear_gaussian import (
    correlated_data,
    exact_elbo,
    exact_posterior,
    guide_gaussian,
    log_evidence,
    model_for,
)

pytestmark = pytest.mark.slow  # fits every family to its exact posterior

D = 4
# Each Gaussian family's default and the variant whose ELBO is compared below (4,000 steps each;
# every variant is checked against a dense MultivariateNormal in tests/guides). The point mass:
# tests/guides/families/test_point_mass.py.
FAMILIES = {
    label: case
    for label, case in GAUSSIAN.items()
    if label in PRIMARY or label == "tridiagonal_free"
}


@pytest.fixture(scope="module")
def problem():
    x, y = correlated_data(n=1000, d=D, corr=0.9, seed=1)
    mean, precision = exact_posterior(x, y)
    return x, y, mean, precision


@pytest.fixture(scope="module")
def fitted(problem):
    x, y, _, _ = problem
    out, medians = {}, None
    # The diagonal family first; every other family starts from its means (a warm start, as in
    # practice: the posch parameterisation's Var = tau^2 m^2 puts a log barrier at m = 0, so
    # its means cannot change sign during the fit).
    for key in ["diagonal", *(k for k in FAMILIES if k != "diagonal")]:
        family, options = FAMILIES[key]
        options = {**options, "init_scale": 0.05}
        if medians is not None:
            options["init_loc_fn"] = lambda site, start=medians: start[site["name"]]
        fit = zoo.fit(
            model_for(D),
            guides.family(family, **options),
            (x, y),
            num_steps=4000,
            batch_size=1000,
            lr=0.05,
            optim=zoo.Optim(lr_schedule=lambda step: 0.999**step),
            run=zoo.Run(progress=False),
        )
        if key == "diagonal":
            medians = fit.guide.median()
        out[key] = guide_gaussian(fit.guide)
    return out


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_recovers_the_posterior_mean(family, problem, fitted):
    _, _, mean, precision = problem
    got, _ = fitted[family]
    sd = torch.linalg.inv(precision).diagonal().sqrt()
    assert ((got - mean).abs() / sd).max() < 0.25


def test_structured_families_have_a_higher_elbo_than_diagonal(problem, fitted):
    x, y, _, _ = problem
    elbos = {k: exact_elbo(x, y, *fitted[k]) for k in FAMILIES}
    bound = log_evidence(x, y)
    tol = 0.05
    for k, v in elbos.items():
        assert v <= bound + tol, (k, v, bound)
    # Correlated inputs: the diagonal family pays for its independence assumption.
    assert bound - elbos["diagonal"] > 1.0
    assert elbos["tridiagonal_free"] >= elbos["diagonal"] - tol
    assert elbos["lowrank"] >= elbos["diagonal"] - tol
    # A (1, D) weight's matrix normal has a full D x D column covariance: nearly exact; so has
    # the block-diagonal family, whose default block (16) holds the whole weight.
    assert bound - elbos["matrix_normal"] < 0.2
    assert bound - elbos["block_diagonal"] < 0.2
