"""Every form of data answers the same questions in one place (:mod:`zoo.data.forms`): its
length, its batches an epoch, its bytes before it is read and its tensors."""

import math

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

from zoo.data import forms

X, Y = torch.randn(10, 3), torch.arange(10)


class Items(Dataset):
    def __len__(self):
        return len(X)

    def __getitem__(self, i):
        return X[i], Y[i]


class Stream(IterableDataset):
    def __iter__(self):
        return iter(zip(X, Y))


BYTES = X.numel() * X.element_size() + Y.numel() * Y.element_size()

#: form -> (size, batches of 4 an epoch, bytes known before reading)
FORMS = {
    "tuple": ((X, Y), 10, 3, BYTES),
    "list": ([X, Y], 10, 3, BYTES),
    "tensor dataset": (TensorDataset(X, Y), 10, 3, BYTES),
    "map dataset": (Items(), 10, 3, BYTES),
    "loader of a map dataset": (DataLoader(Items(), batch_size=3), 10, 4, BYTES),
    "iterable dataset": (Stream(), None, None, None),
    "loader of a stream": (DataLoader(Stream(), batch_size=5), None, None, None),
}


@pytest.mark.parametrize("label", list(FORMS))
def test_every_form_answers_size_batches_bytes_and_tensors(label):
    data, n, batches, nbytes = FORMS[label]
    assert forms.size(data) == n
    if label == "loader of a stream":
        with pytest.raises(TypeError):  # a loader over a stream has no length to give
            forms.batches_per_epoch(data, 4)
    else:
        assert forms.batches_per_epoch(data, 4) == batches
    assert forms.nbytes(data) == nbytes
    x, y = forms.gather_tensors(data)
    assert torch.equal(x, X) and torch.equal(y, Y)


def test_the_empty_dataset_holds_no_bytes_and_gathers_to_a_clear_error():
    empty = TensorDataset(torch.zeros(0, 3), torch.zeros(0))
    assert forms.size(empty) == 0 and forms.nbytes(empty) == 0

    class Nothing(Dataset):
        def __len__(self):
            return 0

    assert forms.nbytes(Nothing()) == 0
    with pytest.raises(ValueError, match="empty"):
        forms.gather_tensors(Nothing())


def test_a_form_the_library_does_not_know_is_refused_by_name():
    assert forms.size("not data") is None and forms.size(42) is None
    with pytest.raises(TypeError, match="got str"):
        forms.as_tensors("not data")
    with pytest.raises(ValueError, match="different lengths"):
        forms.as_tensors((X, Y[:3]))
    with pytest.raises(ValueError, match="TensorDataset for fit must hold"):
        forms.as_tensors(TensorDataset(X, Y, Y))
    assert forms.batches_per_epoch((X, Y), 3) == math.ceil(10 / 3)
