"""Held-out metrics of anything that predicts like a fit (a ``FitResult``, an ensemble, a
Laplace approximation): one path from data to the model's likelihood's metrics."""

from __future__ import annotations

from zoo.data.checks import check_labelled_data, gather_tensors


def evaluate(result, data, **predict_options) -> dict[str, float]:
    """The metrics of ``result.model``'s likelihood on held-out ``data`` (``(X, y)``, a
    ``Dataset`` or a ``DataLoader``), from ``result.predict(x, **predict_options)``; the data
    are checked against the model on ``result.device`` first."""
    x, y = gather_tensors(data)
    check_labelled_data(result.model, x, y, result.device)
    pred = result.predict(x, **predict_options)
    return result.model.likelihood.metrics(pred, y.to(pred.outputs.device))
