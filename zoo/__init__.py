"""A Pyro model zoo of Bayesian neural networks.

import zoo, guides
model = zoo.models.LeNet5()
fit = zoo.fit(model, "tridiagonal", zoo.data.mnist(), epochs=2)
fit.evaluate(zoo.data.mnist(train=False))
"""

from zoo import data, likelihoods, metrics, models, priors
from zoo.comparison import compare
from zoo.divergence import FitDivergedError
from zoo.elbo import ElboScale
from zoo.objective import Objective
from zoo.prediction import ClassificationPrediction, Prediction, RegressionPrediction
from zoo.predictive import predict
from zoo.recipes import REGRESSION_FIT
from zoo.result import FitResult, FitState, load
from zoo.training import fit

__all__ = [
    "REGRESSION_FIT",
    "ClassificationPrediction",
    "ElboScale",
    "FitDivergedError",
    "FitResult",
    "FitState",
    "Objective",
    "Prediction",
    "RegressionPrediction",
    "compare",
    "data",
    "fit",
    "likelihoods",
    "load",
    "metrics",
    "models",
    "predict",
    "priors",
]
__version__ = "0.2.0"
