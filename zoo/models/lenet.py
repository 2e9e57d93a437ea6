"""LeNet-5 as used by Posch & Pilz (Caffe's MNIST LeNet)."""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from zoo.models.base import BayesianModel
from zoo.models.checks import check_sizes
from zoo.models.predictions import ClassificationPrediction
from zoo.priors import Prior


class MaxPool2x2(nn.Module):
    """2 x 2 max pooling with stride 2, as ``nn.MaxPool2d(2)`` (odd last rows and columns are
    dropped), over any leading dimensions.

    Without autograd on the CPU it takes the maximum over row pairs, then column pairs, of
    strided views (prediction: faster than ``max_pool2d`` on an NCHW batch); training and CUDA
    use ``max_pool2d``, whose backward is the faster one.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu" or (torch.is_grad_enabled() and x.requires_grad):
            return F.max_pool2d(x, 2)
        x = x[..., : x.shape[-2] // 2 * 2, : x.shape[-1] // 2 * 2]
        rows = torch.maximum(x[..., 0::2, :], x[..., 1::2, :])
        return torch.maximum(rows[..., 0::2], rows[..., 1::2])


class LeNet5Network(nn.Module):
    """conv 20 5x5 -> maxpool 2 -> conv 50 5x5 -> maxpool 2 -> fc hidden -> ReLU -> fc 10.

    There is no nonlinearity after the convolutions, as in Caffe's LeNet and the paper.
    Input ``(B, 1, 28, 28)``.
    """

    def __init__(self, hidden: int = 100, num_classes: int = 10):
        check_sizes("LeNet-5's hidden and num_classes", [hidden, num_classes])
        check_sizes("LeNet-5's hidden width", [800, hidden, num_classes])
        super().__init__()
        self.conv1 = nn.Conv2d(1, 20, 5)
        self.conv2 = nn.Conv2d(20, 50, 5)
        self.fc1 = nn.Linear(50 * 4 * 4, hidden)
        self.fc2 = nn.Linear(hidden, num_classes)
        self.pool = MaxPool2x2()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.conv1(x))
        x = self.pool(self.conv2(x))
        x = torch.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


class LeNet5(BayesianModel[ClassificationPrediction]):
    """Bayesian LeNet-5 for ``(B, 1, 28, 28)`` images, 10 classes.

    Parameters
    ----------
    hidden : int, default 100
        Width of the first fully connected layer (the paper uses 100 and 250).
    prior : Prior or float, optional
        Weight prior; default ``NormalPrior(1.0)`` (the paper's choice; a regression task gets
        :func:`zoo.priors.default_prior`'s).
    num_classes : int, default 10
        Outputs of the last layer.
    """

    def __init__(
        self, hidden: int = 100, prior: Prior | float | None = None, num_classes: int = 10
    ):
        super().__init__(
            LeNet5Network(hidden, num_classes),
            task="classification",
            prior=prior,
            input_shape=(1, 28, 28),
        )

    def spec(self) -> dict | None:
        # read off the network: models pickled by version 1 have no record of their arguments
        return self._class_spec(
            **{
                "hidden": cast(nn.Linear, self.net.fc1).out_features,
                "num_classes": cast(nn.Linear, self.net.fc2).out_features,
            }
        )
