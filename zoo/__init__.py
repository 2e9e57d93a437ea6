"""A Pyro model zoo of Bayesian neural networks.

import zoo, guides
model = zoo.models.LeNet5()
fit = zoo.fit(model, "tridiagonal", zoo.data.mnist(), epochs=2)
fit.evaluate(zoo.data.mnist(train=False))
"""

from zoo import data, metrics, models, priors
from zoo.compare import compare
from zoo.elbo import ElboScale
from zoo.fit import FitDivergedError, FitResult, FitState, fit, load
from zoo.predictive import Prediction, predict

__all__ = [
    "ElboScale",
    "compare",
    "FitDivergedError",
    "FitResult",
    "FitState",
    "Prediction",
    "data",
    "fit",
    "load",
    "metrics",
    "models",
    "predict",
    "priors",
]
__version__ = "0.1.0"
