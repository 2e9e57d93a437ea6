"""The model zoo: Pyro programs with a sample site over every weight and bias."""

from zoo.models.base import BayesianModel
from zoo.models.cifar import CifarNet
from zoo.models.convert import from_module
from zoo.models.lenet import LeNet5
from zoo.models.mlp import BayesianMLP

__all__ = ["BayesianMLP", "BayesianModel", "CifarNet", "LeNet5", "from_module"]
