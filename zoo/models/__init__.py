"""The model zoo: Pyro programs with a sample site over every weight and bias."""

from zoo import priors
from zoo.models import likelihoods
from zoo.models.alexnet import AlexNet
from zoo.models.base import BayesianModel
from zoo.models.cifar import CifarNet
from zoo.models.convert import from_module
from zoo.models.lenet import LeNet5
from zoo.models.mlp import BayesianMLP
from zoo.models.recurrent import RecurrentClassifier
from zoo.models.resnet import ResNet
from zoo.models.statistics import frozen_statistics
from zoo.models.transformer import TransformerClassifier

__all__ = [
    "AlexNet",
    "BayesianMLP",
    "BayesianModel",
    "CifarNet",
    "LeNet5",
    "RecurrentClassifier",
    "ResNet",
    "TransformerClassifier",
    "build",
    "frozen_statistics",
    "from_module",
]

_CLASSES = {
    cls.__name__: cls
    for cls in (
        AlexNet,
        BayesianMLP,
        CifarNet,
        LeNet5,
        RecurrentClassifier,
        ResNet,
        TransformerClassifier,
    )
}


def build(spec: dict) -> BayesianModel:
    """The model that ``model.spec()`` describes (plain data), e.g. from a saved fit."""
    cls = _CLASSES.get(spec.get("class", ""))
    if cls is None:
        raise ValueError(f"unknown model class {spec.get('class')!r}; known: {sorted(_CLASSES)}")
    args = dict(spec["args"])
    args["prior"] = priors.from_spec(args["prior"])
    if "likelihood" in args:
        args["likelihood"] = likelihoods.from_spec(args["likelihood"])
    return cls(**args)
