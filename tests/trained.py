"""A small CNN with batch norm trained in a plain PyTorch loop, as users have their networks:
the trained network that the tests of ``from_module``'s trained start, the centred prior and
the ensemble's fresh members share (:func:`trained_cnn`, made once per process)."""

import functools

import torch
import torch.nn.functional as F
from torch import nn


def cnn() -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(8 * 4 * 4, 3),
    )


def blobs(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Three classes of 8x8 images, each a bright quadrant plus noise."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 3, (n,), generator=g)
    x = 0.5 * torch.randn(n, 1, 8, 8, generator=g)
    for c, (r, s) in enumerate([(0, 0), (0, 4), (4, 0)]):
        x[y == c, :, r : r + 4, s : s + 4] += 1.0
    return x, y


@functools.cache
def _trained():
    x, y = blobs(600, 0)
    gen = torch.Generator().manual_seed(0)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        net = cnn()
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    for _ in range(6):
        for idx in torch.randperm(len(x), generator=gen).split(64):
            opt.zero_grad()
            F.cross_entropy(net(x[idx]), y[idx]).backward()
            opt.step()
    return net.eval(), (x, y), blobs(400, 1)


def trained_cnn():
    """``(net, (x, y), (x_test, y_test))``: a copy of the trained CNN (in evaluation mode,
    every parameter trainable) and its training and test data."""
    import copy

    net, train, test = _trained()
    return copy.deepcopy(net), train, test
