"""Bayesian linear regression with a Gaussian prior and likelihood: the exact posterior, the
exact mean-field optimum and the exact ELBO of any Gaussian, to check fits against."""

import math

import torch

import guides
from zoo.models import BayesianMLP
from zoo.priors import NormalPrior

NOISE, PRIOR = 1.0, 1.0


def correlated_data(n=1000, d=3, corr=0.8, seed=0):
    """AR(1)-correlated inputs (neighbour correlation ``corr``) and a linear target."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.arange(d, dtype=torch.float64)
    cov = corr ** (idx[:, None] - idx[None, :]).abs()
    x = torch.randn(n, d, generator=g, dtype=torch.float64) @ torch.linalg.cholesky(cov).T
    w = torch.tensor([1.0, -1.5, 0.8, 2.0, -1.2][:d], dtype=torch.float64)
    y = x @ w + 0.5 + NOISE * torch.randn(n, generator=g, dtype=torch.float64)
    return x, y


def model_for(d):
    return BayesianMLP(d, (), 1, prior=NormalPrior(PRIOR), noise=NOISE).double()


def design(x):
    return torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], 1)


def exact_posterior(x, y):
    """Mean and precision of p(w, b | data), parameters ordered (w_1..w_d, b)."""
    phi = design(x)
    precision = torch.eye(phi.shape[1], dtype=x.dtype) / PRIOR**2 + phi.T @ phi / NOISE**2
    mean = torch.linalg.solve(precision, phi.T @ y / NOISE**2)
    return mean, precision


def log_evidence(x, y):
    phi = design(x)
    cov = NOISE**2 * torch.eye(len(y), dtype=x.dtype) + PRIOR**2 * phi @ phi.T
    return torch.distributions.MultivariateNormal(torch.zeros_like(y), cov).log_prob(y).item()


def guide_gaussian(guide):
    """Mean and dense covariance of the guide over (w_1..w_d, b) (sites are independent), on the
    CPU like the data (a fit on a GPU machine runs on CUDA)."""
    w = guide.get_posterior("fc1.weight")
    b = guide.get_posterior("fc1.bias")
    mean = torch.cat([w.mean.reshape(-1), b.mean.reshape(-1)]).detach()
    cov = torch.block_diag(w.covariance_matrix, b.covariance_matrix).detach()
    return mean.cpu(), cov.cpu()


def exact_elbo(x, y, mean, cov):
    """ELBO of q = N(mean, cov) for the linear-Gaussian model, in closed form (a float)."""
    return exact_elbo_tensor(x, y, mean, cov).item()


def exact_elbo_tensor(x, y, mean, cov):
    """The closed-form ELBO as a differentiable function of ``mean`` and ``cov``."""
    phi = design(x)
    k, n = len(mean), len(y)
    resid = y - phi @ mean
    loglik = (
        -0.5 * n * math.log(2 * math.pi * NOISE**2)
        - 0.5 * (resid.pow(2).sum() + torch.trace(phi @ cov @ phi.T)) / NOISE**2
    )
    logprior = (
        -0.5 * k * math.log(2 * math.pi * PRIOR**2)
        - 0.5 * (mean.pow(2).sum() + torch.trace(cov)) / PRIOR**2
    )
    entropy = 0.5 * (k * (1 + math.log(2 * math.pi)) + torch.logdet(cov))
    return loglik + logprior + entropy


def decaying(step, rate=0.998):
    return rate**step


#: The mean-field recipe the distributed test and its one-process twin share (the comparison
#: between them holds only if both fit with it): the guide, and zoo.fit's options, flat (pass
#: them through zoo.training.options.grouped).
MEAN_FIELD_GUIDE = guides.family("diagonal", init_scale=0.05)
MEAN_FIELD_FIT = {"lr": 0.03, "lr_schedule": decaying}
