"""A Pyro model zoo of Bayesian neural networks.

import zoo, guides
model = zoo.models.LeNet5()
fit = zoo.fit(model, "tridiagonal", zoo.data.mnist(), epochs=2)
fit.evaluate(zoo.data.mnist(train=False))
"""

from zoo import data, engine, likelihoods, metrics, models, priors
from zoo.comparison import compare
from zoo.convergence import Convergence
from zoo.divergence import FitDivergedError
from zoo.elbo import ElboScale
from zoo.engine import StepEngine
from zoo.objective import Objective
from zoo.options import Engine, Loss, Optim, Run
from zoo.prediction_result import ClassificationPrediction, Prediction, RegressionPrediction
from zoo.predictive import predict
from zoo.recipes import REGRESSION_FIT
from zoo.reference_result import Reference
from zoo.reference_sampling import Budget as ReferenceBudget
from zoo.reference_sampling import ReferenceTooLargeError, reference
from zoo.result import FitResult, FitState, load
from zoo.trainer import CheckpointError
from zoo.training import fit

__all__ = [
    "CheckpointError",
    "REGRESSION_FIT",
    "ClassificationPrediction",
    "Convergence",
    "ElboScale",
    "Engine",
    "FitDivergedError",
    "FitResult",
    "FitState",
    "Loss",
    "Objective",
    "Optim",
    "Prediction",
    "Reference",
    "ReferenceBudget",
    "ReferenceTooLargeError",
    "RegressionPrediction",
    "Run",
    "StepEngine",
    "compare",
    "data",
    "engine",
    "fit",
    "likelihoods",
    "load",
    "metrics",
    "models",
    "predict",
    "priors",
    "reference",
]
__version__ = "0.2.0"

#: Modules read as ``zoo.<name>`` without importing them first; each loads its heavy stack
#: (Lightning, matplotlib, ArviZ) on first use only.
LAZY_MODULES = ("arviz", "lightning", "plots")


def __getattr__(name: str):
    if name in LAZY_MODULES:
        import importlib

        return importlib.import_module(f"zoo.{name}")
    raise AttributeError(f"module 'zoo' has no attribute {name!r}")
