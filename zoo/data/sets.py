"""Data sets: the 1D regression toy and torchvision's image sets as in-memory tensors.

The data root is, in order: the ``root`` argument, the ``ZOO_DATA`` environment variable, or
``~/.cache/bnn-zoo/data``. With the raw files already in ``<root>/MNIST/raw/`` torchvision finds
them and downloads nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch.utils.data import TensorDataset

from zoo.runtime.packages import torchvision_datasets

# Per-channel statistics of the training sets, used to standardise images.
_MNIST_STATS = ((0.1307,), (0.3081,))
_FASHION_STATS = ((0.2860,), (0.3530,))
_CIFAR_STATS = ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))


def data_root(root: str | os.PathLike | None = None) -> Path:
    """Resolve the data root: argument, else ``$ZOO_DATA``, else ``~/.cache/bnn-zoo/data``."""
    if root is not None:
        return Path(root).expanduser()
    if os.environ.get("ZOO_DATA"):
        return Path(os.environ["ZOO_DATA"]).expanduser()
    return Path.home() / ".cache" / "bnn-zoo" / "data"


def toy_regression(
    n: int = 160, noise: float = 0.1, seed: int = 0, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """The classic 1D toy: ``y = sin(2x) + 0.3 x + noise`` observed on two separate intervals.

    ``x`` is drawn uniformly from ``[-3, -1]`` and ``[1, 3]`` (half each), so a good posterior
    is confident on them and uncertain between (around 0) and beyond (``|x| > 3``).

    Returns
    -------
    X : Tensor ``(n, 1)``
    y : Tensor ``(n,)``
    """
    g = torch.Generator().manual_seed(seed)
    half = n // 2
    left = -3 + 2 * torch.rand(half, generator=g, dtype=torch.float64)
    right = 1 + 2 * torch.rand(n - half, generator=g, dtype=torch.float64)
    x = torch.cat([left, right])
    y = toy_function(x) + noise * torch.randn(n, generator=g, dtype=torch.float64)
    return x.unsqueeze(-1).to(dtype), y.to(dtype)


def toy_function(x: torch.Tensor) -> torch.Tensor:
    """The noise-free curve of :func:`toy_regression`."""
    return torch.sin(2 * x) + 0.3 * x


#: How ``mnist`` and ``fashion_mnist`` lay out each image.
LAYOUTS = ("image", "padded", "sequence")


def _image_dataset(cls, root, train, download, stats, limit, layout="image") -> TensorDataset:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    where = data_root(root)
    try:
        ds = cls(str(where), train=train, download=download)
    except (RuntimeError, OSError) as err:  # torchvision: no files and no (working) download
        source = (
            "the root argument"
            if root is not None
            else "$ZOO_DATA"
            if os.environ.get("ZOO_DATA")
            else "the default root"
        )
        raise FileNotFoundError(
            f"{cls.__name__} is not under {where} (from {source}) and could not be "
            f"{'downloaded' if download else 'read (download=False)'}: {err}. Put the "
            f"{files_where(cls, where)}, or point root= (or the ZOO_DATA environment variable) "
            "at the folder that holds them"
        ) from err
    images = torch.as_tensor(ds.data)
    if images.dim() == 3:  # (N, H, W) grey images
        images = images.unsqueeze(1)
    else:  # CIFAR: (N, H, W, C) uint8 numpy
        images = images.permute(0, 3, 1, 2)
    labels = torch.as_tensor(ds.targets, dtype=torch.long)
    if limit is not None:
        images, labels = images[:limit], labels[:limit]
    mean = torch.tensor(stats[0]).view(1, -1, 1, 1)
    std = torch.tensor(stats[1]).view(1, -1, 1, 1)
    if layout == "padded":  # two rows and columns of background each side: 28 -> 32
        images = torch.nn.functional.pad(images, (2, 2, 2, 2))
    x = (images.float() / 255.0 - mean) / std
    if layout == "sequence":
        x = x.squeeze(1)
    return TensorDataset(x, labels)


def mnist(
    root: str | os.PathLike | None = None,
    train: bool = True,
    download: bool = True,
    limit: int | None = None,
    layout: str = "image",
) -> TensorDataset:
    """MNIST as a standardised ``TensorDataset`` of images and labels (``limit``: the first
    ``limit`` examples).

    ``layout``: ``"image"``, ``(N, 1, 28, 28)`` (LeNet-5, the ResNet); ``"padded"``,
    ``(N, 1, 32, 32)``, two rows and columns of background on each side (networks made for
    CIFAR's 32 x 32); ``"sequence"``, ``(N, 28, 28)``, each image as 28 rows of 28 pixels read
    top to bottom ("sequential MNIST", for the transformer and the recurrent classifier).
    Pixels are standardised with the training set's mean and standard deviation.
    """
    return _image_dataset(
        torchvision_datasets().MNIST, root, train, download, _MNIST_STATS, limit, layout
    )


def fashion_mnist(
    root: str | os.PathLike | None = None,
    train: bool = True,
    download: bool = True,
    limit: int | None = None,
    layout: str = "image",
) -> TensorDataset:
    """Fashion-MNIST as a standardised ``TensorDataset``, laid out as :func:`mnist`'s."""
    return _image_dataset(
        torchvision_datasets().FashionMNIST, root, train, download, _FASHION_STATS, limit, layout
    )


def files_where(cls: type, root: Path) -> str:
    """Where torchvision reads ``cls``'s files under ``root``, in words: MNIST-like sets keep
    their raw files in ``<root>/<Class>/raw/``; CIFAR-10 its extracted python batches in
    ``<root>/cifar-10-batches-py/`` (or the archive ``cifar-10-python.tar.gz`` in ``root``)."""
    folder = getattr(cls, "base_folder", None)
    if folder:  # CIFAR: torchvision's own folder name, not the class's
        return (
            f"extracted batches in {Path(root) / folder} (data_batch_1 ... test_batch, "
            "batches.meta)"
        )
    return f"raw files in {Path(root) / cls.__name__ / 'raw'}"


def cifar10(
    root: str | os.PathLike | None = None,
    train: bool = True,
    download: bool = True,
    limit: int | None = None,
) -> TensorDataset:
    """CIFAR-10 as a standardised ``TensorDataset`` of ``(N, 3, 32, 32)`` images."""
    return _image_dataset(
        torchvision_datasets().CIFAR10, root, train, download, _CIFAR_STATS, limit
    )
