"""Deprecated: the prediction types moved to :mod:`zoo.prediction_result` (beside
:mod:`zoo.predictive`, which computes them). Import them from ``zoo`` or from there."""

import warnings

from zoo.prediction_result import ClassificationPrediction, Prediction, RegressionPrediction

warnings.warn(
    "zoo.prediction is deprecated: import Prediction, ClassificationPrediction and "
    "RegressionPrediction from zoo (or zoo.prediction_result)",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["ClassificationPrediction", "Prediction", "RegressionPrediction"]
