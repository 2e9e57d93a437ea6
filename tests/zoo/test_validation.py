"""Bad input fails before any training step, with a message that says what to fix."""

import pytest
import torch

import zoo
from zoo.models import BayesianMLP, LeNet5


def classifier():
    return BayesianMLP(3, (4,), 3, task="classification")


X = torch.randn(20, 3, generator=torch.Generator().manual_seed(0))
Y = torch.randint(0, 3, (20,))

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
    "negative_label": (classifier, (X, Y - 1), {}, ValueError, r"got values in \[-1"),
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
    "family_cannot_serve": (
        classifier,
        (X, Y),
        {"guide": lambda m: __import__("guides").AutoMixed(m, {"*": "matrix_normal"})},
        ValueError,
        "'fc1.bias'.*cannot serve",
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
        zoo.fit(make_model(), guide, data, progress=False, callbacks=[steps.append], **options)
    assert steps == []
