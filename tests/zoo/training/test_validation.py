"""Bad input fails before any training step, with a message that says what to fix."""

import pytest
import torch

import zoo
from zoo.models import BayesianMLP, LeNet5
from zoo.training.options import grouped


def classifier():
    return BayesianMLP(3, (4,), 3, task="classification")


X = torch.randn(20, 3, generator=torch.Generator().manual_seed(0))
# every class present, whatever the global generator's state at import (it was drawn from it:
# a draw without a 0 made the negative-label case a fit, under pytest-xdist's other order)
Y = torch.arange(20) % 3

CASES = {
    "lengths": (classifier, (X, Y[:15]), {}, ValueError, "different lengths: 20 inputs but 15"),
    "nan_x": (
        classifier,
        (X.index_put((torch.tensor([3]), torch.tensor([1])), torch.tensor(float("nan"))), Y),
        {},
        ValueError,
        "NaN or infinite",
    ),
    "inf_y": (
        lambda: BayesianMLP(3, (4,), 1),
        (X, torch.full((20,), float("inf"))),
        {},
        ValueError,
        "NaN or infinite",
    ),
    "float_labels": (classifier, (X, Y.float() + 0.5), {}, ValueError, "integer class indices"),
    "label_range": (classifier, (X, Y + 1), {}, ValueError, r"labels must lie in \[0, 3\)"),
    "negative_label": (
        classifier,
        (X, Y - 1),
        {},
        ValueError,
        r"got -1 at item \d+ \(values in \[-1",
    ),
    "input_shape": (
        lambda: LeNet5(),
        (torch.randn(20, 784), torch.randint(0, 10, (20,))),
        {},
        ValueError,
        r"expects inputs of shape \(N, 1, 28, 28\)",
    ),
    "empty": (classifier, (X[:0], Y[:0]), {}, ValueError, "empty"),
    "batch_size": (
        classifier,
        (X, Y),
        {"batch_size": 0},
        ValueError,
        "batch_size must be a positive",
    ),
    "epochs": (classifier, (X, Y), {"epochs": -1}, ValueError, "epochs must be a positive"),
    "lr": (classifier, (X, Y), {"lr": 0.0}, ValueError, "lr must be a positive"),
    "guide_name": (
        classifier,
        (X, Y),
        {"guide": "diag"},
        ValueError,
        r"Unknown guide family 'diag'.*'diagonal'",
    ),
    "not_tensors": (classifier, (X.numpy(), Y), {}, TypeError, "torch tensors"),
    "one_hot": (classifier, (X, torch.nn.functional.one_hot(Y, 3)), {}, ValueError, "argmax"),
    "regression_target_shape": (
        lambda: BayesianMLP(3, (4,), 1),
        (X, torch.randn(20, 2)),
        {},
        ValueError,
        r"regression targets must have shape \(N,\) for this model, got y of shape \(N, 2\)",
    ),
    "integer_inputs": (classifier, (X.long(), Y), {}, TypeError, r"floating-point.*X.float\(\)"),
    "float64_inputs": (classifier, (X.double(), Y), {}, TypeError, "torch.float64 but the model"),
    "regression_column_target": (
        lambda: BayesianMLP(3, (4,), 1),
        (X, torch.randn(20, 1)),
        {},
        ValueError,
        r"got y of shape \(N, 1\); pass y.squeeze\(-1\)",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_rejected_before_training(case):
    make_model, data, options, exc, phrase = CASES[case]
    steps = []
    options = dict(options)
    guide = options.pop("guide", "diagonal")
    with pytest.raises(exc, match=phrase):
        zoo.fit(
            make_model(),
            guide,
            data,
            **grouped({**options, "run": zoo.Run(progress=False, callbacks=[steps.append])}),
        )
    assert steps == []


@pytest.fixture(scope="module")
def fitted():
    return zoo.fit(
        classifier(),
        "diagonal",
        (X, Y),
        num_steps=2,
        run=zoo.Run(progress=False),
    )


NAN_X = X.clone().index_fill_(0, torch.tensor([4]), float("nan"))
PREDICT_CASES = {
    "evaluate_lengths": (lambda f: f.evaluate((X, Y[:5])), ValueError, "different lengths"),
    "evaluate_label_range": (lambda f: f.evaluate((X, Y + 5)), ValueError, r"lie in \[0, 3\)"),
    "evaluate_nan": (lambda f: f.evaluate((NAN_X, Y)), ValueError, "first at item 4"),
    "evaluate_shape": (lambda f: f.evaluate((X[:, :2], Y)), ValueError, "shape"),
    "arviz_label_range": (lambda f: f.to_arviz((X, Y + 5)), ValueError, r"lie in \[0, 3\)"),
    "predict_shape": (lambda f: f.predict(torch.randn(5, 2)), ValueError, r"\(N, 2\)"),
    "predict_nan": (lambda f: f.predict(NAN_X), ValueError, "NaN or infinite"),
    "predict_integer": (lambda f: f.predict(X.long()), TypeError, "floating-point"),
    "predict_empty": (lambda f: f.predict(X[:0]), ValueError, "no examples"),
    "predict_not_a_tensor": (lambda f: f.predict(X.numpy()), TypeError, "torch tensor"),
}


@pytest.mark.parametrize("case", list(PREDICT_CASES))
def test_bad_input_to_prediction_and_evaluation_gets_a_clear_error(fitted, case):
    call, exc, phrase = PREDICT_CASES[case]
    with pytest.raises(exc, match=phrase):
        call(fitted)
