"""The CNN of Caffe's ``cifar10_full`` example, used by Posch & Pilz for CIFAR-10."""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from zoo.models.base import BayesianModel
from zoo.models.predictions import ClassificationPrediction
from zoo.priors import Prior


class WithinChannelLRN(nn.Module):
    """Caffe's ``LRN`` with ``norm_region: WITHIN_CHANNEL``.

    ``x / (1 + alpha * mean_{local_size x local_size window}(x^2))^beta`` (zero padded).
    """

    def __init__(self, local_size: int = 3, alpha: float = 5e-5, beta: float = 0.75):
        super().__init__()
        self.local_size, self.alpha, self.beta = local_size, alpha, beta

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pad = (self.local_size - 1) // 2
        avg = F.avg_pool2d(x.pow(2), self.local_size, stride=1, padding=pad)
        return x / (1 + self.alpha * avg).pow(self.beta)


class CifarNetwork(nn.Module):
    """conv1 32 5x5 -> maxpool 3/2 -> ReLU -> LRN -> conv2 32 5x5 -> ReLU -> avgpool 3/2 -> LRN
    -> conv3 64 5x5 -> ReLU -> avgpool 3/2 -> fc1 10. Input ``(B, 3, 32, 32)``.

    Pooling rounds up as Caffe does (32 -> 16 -> 8 -> 4).
    """

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, 5, padding=2)
        self.conv2 = nn.Conv2d(32, 32, 5, padding=2)
        self.conv3 = nn.Conv2d(32, 64, 5, padding=2)
        self.fc1 = nn.Linear(64 * 4 * 4, num_classes)
        self.norm = WithinChannelLRN()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(F.relu(F.max_pool2d(self.conv1(x), 3, 2, ceil_mode=True)))
        x = self.norm(F.avg_pool2d(F.relu(self.conv2(x)), 3, 2, ceil_mode=True))
        x = F.avg_pool2d(F.relu(self.conv3(x)), 3, 2, ceil_mode=True)
        return self.fc1(x.flatten(1))


class CifarNet(BayesianModel[ClassificationPrediction]):
    """Bayesian ``cifar10_full`` CNN for ``(B, 3, 32, 32)`` images, 10 classes.

    Parameters
    ----------
    prior : Prior or float, optional
        Weight prior; default ``NormalPrior(1.0)`` (a regression task gets
        :func:`zoo.priors.default_prior`'s).
    num_classes : int, default 10
        Outputs of the last layer.
    """

    def __init__(self, prior: Prior | float | None = None, num_classes: int = 10):
        super().__init__(
            CifarNetwork(num_classes),
            task="classification",
            prior=prior,
            input_shape=(3, 32, 32),
        )

    def spec(self) -> dict | None:
        # read off the network: models pickled by version 1 have no record of their arguments
        return self._class_spec(**{"num_classes": cast(nn.Linear, self.net.fc1).out_features})
