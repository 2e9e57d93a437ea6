"""Plain-PyTorch MC dropout on LeNet-5: the reference the library's ``mc_dropout`` family is
held to in ``benchmarks/mnist_accuracy.py --dropout-study``.

Standard dropout training, no Pyro: ``nn.Dropout`` on the inputs of chosen layers (inverted
dropout: kept inputs are divided by ``1 - p``), cross-entropy averaged over the minibatch plus
the L2 penalty that Gal & Ghahramani's derivation gives for a ``N(0, s^2)`` prior on the
family's ``M`` (``W_torch = (1 - p) M``):

    loss = mean CE + (1 / N) sum_layers ||W_torch||^2 / (2 s^2 (1 - p_layer))
                   + (1 / N) sum_layers ||b||^2 / (2 s^2),

i.e. weight decay ``lambda = 1 / (N s^2 (1 - p))`` in torch's ``weight_decay`` convention (the
``(1 - p) / (2 N s^2) ||M||^2`` of the family's KL, read in torch's weights). Adam, the same
batch size, learning rate, epochs and shuffling seed as the library's fit. At test time dropout
stays on and ``T`` passes are averaged (MC dropout); every pass draws fresh masks for every
image.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from zoo.models.lenet import MaxPool2x2
from zoo.models.likelihoods import Categorical
from zoo.models.predictions import ClassificationPrediction


class DropoutLeNet5(nn.Module):
    """LeNet-5 (the zoo's layers) with ``nn.Dropout2d``/``nn.Dropout`` before each layer whose
    entry in ``p`` is positive: ``p = {"conv1": ..., "conv2": ..., "fc1": ..., "fc2": ...}``.
    A convolution's dropout drops whole input channels, as the library's family does."""

    LAYERS = ("conv1", "conv2", "fc1", "fc2")

    def __init__(self, p: dict[str, float], hidden: int = 100):
        super().__init__()
        self.p = {name: float(p.get(name, 0.0)) for name in self.LAYERS}
        self.conv1 = nn.Conv2d(1, 20, 5)
        self.conv2 = nn.Conv2d(20, 50, 5)
        self.fc1 = nn.Linear(50 * 4 * 4, hidden)
        self.fc2 = nn.Linear(hidden, 10)
        self.pool = MaxPool2x2()

    def _drop(self, name: str, x: torch.Tensor) -> torch.Tensor:
        p = self.p[name]
        if p == 0:
            return x
        fn = F.dropout2d if x.dim() == 4 else F.dropout
        return fn(x, p, training=True)  # kept at test time: MC dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.conv1(self._drop("conv1", x)))
        x = self.pool(self.conv2(self._drop("conv2", x)))
        x = torch.relu(self.fc1(self._drop("fc1", x.flatten(1))))
        return self.fc2(self._drop("fc2", x))

    def penalty(self, prior_scale: float) -> torch.Tensor:
        """``sum ||W||^2 / (2 s^2 (1 - p)) + ||b||^2 / (2 s^2)`` over the layers (see the
        module docstring); divide by ``N`` for the per-example loss."""
        total = 0.0
        for name in self.LAYERS:
            layer = getattr(self, name)
            keep = 1 - self.p[name]
            total = total + layer.weight.pow(2).sum() / keep + layer.bias.pow(2).sum()
        return total / (2 * prior_scale**2)


def train(
    dataset,
    p: dict[str, float],
    *,
    epochs: int = 1,
    batch_size: int = 128,
    lr: float = 1e-3,
    prior_scale: float = 1.0,
    seed: int = 0,
) -> DropoutLeNet5:
    """Standard dropout training of :class:`DropoutLeNet5` on a ``TensorDataset`` (see the
    module docstring); the caller's global random state is left as it was."""
    x, y = dataset.tensors
    n = len(x)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = DropoutLeNet5(p)
        opt = torch.optim.Adam(net.parameters(), lr=lr)
        order = torch.Generator().manual_seed(seed)
        for _ in range(epochs):
            for idx in torch.randperm(n, generator=order).split(batch_size):
                loss = F.cross_entropy(net(x[idx]), y[idx]) + net.penalty(prior_scale) / n
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
    return net


@torch.no_grad()
def predict(
    net: DropoutLeNet5, x: torch.Tensor, num_samples: int, seed: int = 0, batch_size: int = 1000
) -> ClassificationPrediction:
    """``num_samples`` dropout passes over ``x``, as the library's categorical predictive (so
    that its metrics are the library's: ``zoo.models.likelihoods.Categorical.metrics``); the
    caller's random state is left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        logits = [torch.cat([net(xb) for xb in x.split(batch_size)]) for _ in range(num_samples)]
    return Categorical().predict(torch.stack(logits), None)
