"""The loop (zoo.trainer, zoo.batches): every pass over an epoch takes a step or the fit stops
with the reason; it never spins."""

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

import zoo
from zoo.models import BayesianMLP


def data(n=300):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 3, generator=g)
    return x, x[:, 0] - x[:, 1]


def test_a_loader_that_drops_every_batch_is_refused_before_training():
    loader = DataLoader(TensorDataset(*data()), batch_size=512, drop_last=True)
    assert len(loader) == 0
    with pytest.raises(ValueError, match="batch_size=512 and drop_last=True over 300"):
        zoo.fit(BayesianMLP(3, (4,), noise=1.0), "diagonal", loader, epochs=1,
                run=zoo.Run(progress=False))  # fmt: skip


class Short(IterableDataset):
    """Says it has 64 examples and yields 32: its loader has 8 batches of 8, yields 4."""

    def __len__(self):
        return 64

    def __iter__(self):
        x, y = data(32)
        return iter(zip(x, y))


def test_data_that_give_fewer_batches_than_their_length_stop_the_fit():
    with pytest.raises(ValueError, match="gave 4 minibatch\\(es\\), but the fit had taken 4") as e:
        zoo.fit(BayesianMLP(3, (4,), noise=1.0), "diagonal", Short(), num_steps=20,
                batch_size=8, run=zoo.Run(progress=False))  # fmt: skip
    assert e.value.result.steps == 4  # the steps taken are not lost
