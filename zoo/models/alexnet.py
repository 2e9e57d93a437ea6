"""An AlexNet-style CNN for 32 x 32 images: the network of the "are structured posteriors worth
it?" table of the source slides (Rossi et al., diagonal against WHVI on CIFAR-10)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from zoo.models.base import BayesianModel
from zoo.models.checks import check_sizes
from zoo.models.predictions import ClassificationPrediction
from zoo.priors import Prior

#: AlexNet's five convolution widths, as in its CIFAR-10 adaptations.
ALEXNET_WIDTHS = (64, 192, 384, 256, 256)


class AlexNetNetwork(nn.Module):
    """conv 5x5 -> ReLU -> maxpool 2 -> conv 5x5 -> ReLU -> maxpool 2 -> three conv 3x3 with
    ReLU -> maxpool 2 -> fc ``hidden`` -> ReLU -> fc ``num_classes``. Inputs of ``size x size``
    (32 for CIFAR-10, 28 for MNIST: the maps are ``size // 8`` wide at the end)."""

    def __init__(self, in_channels=3, num_classes=10, widths=ALEXNET_WIDTHS, hidden=512, size=32):
        widths = tuple(widths)
        if len(widths) != 5:
            raise ValueError(f"widths are five convolution widths, got {widths!r}")
        check_sizes(
            "AlexNet's in_channels, widths, hidden and num_classes",
            [in_channels, *widths, hidden, num_classes],
        )
        if size < 8:
            raise ValueError(f"AlexNet's input size must be at least 8, got {size}")
        super().__init__()
        c = (in_channels, *widths)
        self.conv1 = nn.Conv2d(c[0], c[1], 5, padding=2)
        self.conv2 = nn.Conv2d(c[1], c[2], 5, padding=2)
        self.conv3 = nn.Conv2d(c[2], c[3], 3, padding=1)
        self.conv4 = nn.Conv2d(c[3], c[4], 3, padding=1)
        self.conv5 = nn.Conv2d(c[4], c[5], 3, padding=1)
        self.fc1 = nn.Linear(c[5] * (size // 8) ** 2, hidden)
        self.fc2 = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = F.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = torch.relu(self.conv4(torch.relu(self.conv3(x))))
        x = F.max_pool2d(torch.relu(self.conv5(x)), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


class AlexNet(BayesianModel[ClassificationPrediction]):
    """Bayesian AlexNet-style CNN for ``(B, in_channels, size, size)`` images.

    Parameters
    ----------
    in_channels : int, default 3
    num_classes : int, default 10
    widths : tuple of 5 ints, default ``(64, 192, 384, 256, 256)``
        The convolutions' output channels (smaller ones for a CPU).
    hidden : int, default 512
        Width of the fully connected hidden layer.
    size : int, default 32
        Input height and width.
    prior : Prior or float, optional
        Weight prior; default ``NormalPrior(1.0)``.
    """

    def __init__(
        self,
        in_channels: int = 3,
        num_classes: int = 10,
        widths: tuple[int, ...] = ALEXNET_WIDTHS,
        hidden: int = 512,
        size: int = 32,
        prior: Prior | float | None = None,
    ):
        super().__init__(
            AlexNetNetwork(in_channels, num_classes, widths, hidden, size),
            task="classification",
            prior=prior,
            input_shape=(in_channels, size, size),
        )
        self._args = dict(
            in_channels=in_channels,
            num_classes=num_classes,
            widths=list(widths),
            hidden=hidden,
            size=size,
        )

    def spec(self) -> dict | None:
        return self._class_spec(**self._args)
