"""ResNets for small images: He et al.'s CIFAR ResNets (ResNet-20, -32, -44, -56), with batch
norm, the network of the BNN papers' CIFAR-10 tables."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from zoo.arguments import is_int
from zoo.models.base import BayesianModel
from zoo.models.checks import check_sizes
from zoo.models.convert import deterministic_parameters
from zoo.models.predictions import ClassificationPrediction
from zoo.priors import Prior


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with batch norm and the identity shortcut; where the block halves
    the resolution and doubles the width, the shortcut subsamples and pads the new channels with
    zeros (He et al.'s option A: no parameters)."""

    def __init__(self, in_channels: int, out_channels: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.stride, self.pad = stride, out_channels - in_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        shortcut = x
        if self.stride != 1:
            shortcut = shortcut[..., :: self.stride, :: self.stride]
        if self.pad:
            half = self.pad // 2
            shortcut = F.pad(shortcut, (0, 0, 0, 0, half, self.pad - half))
        return torch.relu(out + shortcut)


class ResNetNetwork(nn.Module):
    """conv 3x3 (``width``) + BN + ReLU, three stages of ``n`` basic blocks (widths ``width``,
    ``2 width``, ``4 width``; the last two start with stride 2), global average pooling, a
    linear layer. ``depth = 6 n + 2``. Any input size; 32 x 32 gives 8 x 8 maps at the end,
    MNIST's 28 x 28 gives 7 x 7."""

    def __init__(self, depth: int = 20, in_channels: int = 3, num_classes: int = 10, width=16):
        check_sizes(
            "ResNet's in_channels, num_classes and width", [in_channels, num_classes, width]
        )
        if not is_int(depth) or depth < 8 or (depth - 2) % 6:
            raise ValueError(f"depth must be 6 n + 2 with n >= 1 (20, 32, 44, 56), got {depth!r}")
        super().__init__()
        n = (depth - 2) // 6
        self.conv1 = nn.Conv2d(in_channels, width, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        blocks, channels = [], width
        for stage, out in enumerate((width, 2 * width, 4 * width)):
            for k in range(n):
                blocks.append(BasicBlock(channels, out, 2 if stage and not k else 1))
                channels = out
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(channels, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.conv1(x)))
        x = self.blocks(x)
        return self.fc(x.mean((-2, -1)))


class ResNet(BayesianModel[ClassificationPrediction]):
    """Bayesian CIFAR ResNet (``depth`` 20 by default: ResNet-20) for ``(B, C, H, W)`` images.

    Convolution and linear weights (and the last layer's bias) are sample sites; batch norm's
    scale and shift are deterministic (point estimates fitted with the ELBO) and its running
    statistics follow training and evaluation modes (:mod:`zoo.models.statistics`).

    Parameters
    ----------
    depth : int, default 20
        ``6 n + 2``: 20, 32, 44, 56, ...
    in_channels : int, default 3
        1 for MNIST (``zoo.data.mnist``'s images, 28 x 28, or padded to 32 x 32).
    num_classes : int, default 10
    width : int, default 16
        Channels of the first stage (the others have 2 and 4 times as many).
    prior : Prior or float, optional
        Weight prior; default ``NormalPrior(1.0)`` (the classification default).
    input_size : int, default 32
        Height and width of the inputs (checked before a fit).
    """

    def __init__(
        self,
        depth: int = 20,
        in_channels: int = 3,
        num_classes: int = 10,
        width: int = 16,
        prior: Prior | float | None = None,
        input_size: int = 32,
    ):
        check_sizes("ResNet's input_size", [input_size])
        net = ResNetNetwork(depth, in_channels, num_classes, width)
        super().__init__(
            net,
            task="classification",
            prior=prior,
            input_shape=(in_channels, input_size, input_size),
            deterministic=deterministic_parameters(net, None, ()),
        )
        self._args = dict(
            depth=depth,
            in_channels=in_channels,
            num_classes=num_classes,
            width=width,
            input_size=input_size,
        )

    def spec(self) -> dict | None:
        return self._class_spec(**self._args)
