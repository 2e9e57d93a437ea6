"""Every data form becomes the same tensors (zoo.data_checks.gather_tensors)."""

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from zoo.data_checks import gather_tensors

X = torch.arange(30.0).reshape(10, 3)
Y = torch.arange(10)


class PairDataset(Dataset):
    """A map-style dataset of (x, y) pairs, like torchvision's."""

    def __len__(self):
        return len(Y)

    def __getitem__(self, i):
        return X[i], Y[i]


@pytest.mark.parametrize(
    "data",
    [
        (X, Y),
        [X, Y],
        TensorDataset(X, Y),
        PairDataset(),
        DataLoader(PairDataset(), batch_size=3),
        DataLoader(TensorDataset(X, Y), batch_size=4),
    ],
    ids=["tuple", "list", "tensor_dataset", "dataset", "loader", "tensor_loader"],
)
def test_every_form_gives_the_examples_in_order(data):
    x, y = gather_tensors(data, batch_size=4)
    assert torch.equal(x, X)
    assert torch.equal(y, Y)


class _Empty(Dataset):
    def __len__(self):
        return 0

    def __getitem__(self, i):
        raise IndexError(i)


def test_empty_dataset_is_an_error():
    with pytest.raises(ValueError, match="empty"):
        gather_tensors(_Empty())


def test_batches_that_are_not_pairs_are_an_error():
    triples = DataLoader(TensorDataset(X, Y, Y), batch_size=5)
    with pytest.raises(ValueError, match=r"pair \(x, y\)"):
        gather_tensors(triples)
