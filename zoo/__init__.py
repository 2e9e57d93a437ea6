"""A Pyro model zoo of Bayesian neural networks.

import zoo, guides
model = zoo.models.LeNet5()
fit = zoo.fit(model, "tridiagonal", zoo.data.mnist(), epochs=2)
fit.evaluate(zoo.data.mnist(train=False))
"""

import importlib

from zoo import data, metrics, models, priors
from zoo.baselines.ensembles import ensemble
from zoo.baselines.laplace_fitting import laplace
from zoo.baselines.subnetworks import subnetwork_guide
from zoo.comparison import compare
from zoo.evaluation.predictive import predict
from zoo.evaluation.prior import prior_predictive
from zoo.inference.elbo import ElboScale
from zoo.inference.objective import Objective
from zoo.mcmc.samplers import NUTS, Sampler
from zoo.mcmc.sampling import Budget as ReferenceBudget
from zoo.mcmc.sampling import ReferenceTooLargeError, reference
from zoo.models import likelihoods
from zoo.models.predictions import ClassificationPrediction, Prediction, RegressionPrediction
from zoo.results.draws import Draws, from_draws
from zoo.results.ensembles import Ensemble
from zoo.results.hmc import Reference
from zoo.results.laplace_approximation import LaplaceFit
from zoo.results.laplace_torch import LaplaceOptions
from zoo.results.loading import load
from zoo.results.posterior import Posterior
from zoo.results.variational import FitResult
from zoo.training.convergence import Convergence
from zoo.training.divergence import FitDivergedError
from zoo.training.fitting import fit
from zoo.training.loop import CallbackView, CheckpointError
from zoo.training.options import Engine, Loss, Optim, Run
from zoo.training.recipes import REGRESSION_FIT
from zoo.training.step import Stepper

__all__ = [
    "CheckpointError",
    "REGRESSION_FIT",
    "ClassificationPrediction",
    "Convergence",
    "Draws",
    "ElboScale",
    "Engine",
    "Ensemble",
    "FitDivergedError",
    "FitResult",
    "LaplaceFit",
    "LaplaceOptions",
    "CallbackView",
    "Loss",
    "NUTS",
    "Objective",
    "Optim",
    "Posterior",
    "Prediction",
    "Reference",
    "ReferenceBudget",
    "ReferenceTooLargeError",
    "RegressionPrediction",
    "Sampler",
    "Run",
    "Stepper",
    "compare",
    "data",
    "ensemble",
    "fit",
    "from_draws",
    "laplace",
    "likelihoods",
    "load",
    "metrics",
    "models",
    "predict",
    "prior_predictive",
    "priors",
    "reference",
    "subnetwork_guide",
]
__version__ = "0.4.0"

#: Modules read as ``zoo.<name>`` without importing them first; each loads its heavy stack
#: (Lightning, matplotlib, ArviZ) on first use only.
LAZY_MODULES = ("arviz", "lightning", "plots")


def __getattr__(name: str):
    if name in LAZY_MODULES:
        return importlib.import_module(f"zoo.{name}")
    raise AttributeError(f"module 'zoo' has no attribute {name!r}")
