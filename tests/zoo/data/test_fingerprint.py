"""The data's fingerprint (zoo.data.fingerprint): the same for the same data in any form, other
for other values, order, shape or dtype."""

import torch
from torch.utils.data import DataLoader, TensorDataset

from zoo.data.fingerprint import data_fingerprint


def xy(n=40):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 3, generator=g), torch.randint(0, 4, (n,), generator=g)


def test_the_same_data_give_the_same_fingerprint():
    x, y = xy()
    assert data_fingerprint((x, y)) == data_fingerprint((x.clone(), y.clone()))
    assert data_fingerprint((x, y)) == data_fingerprint(TensorDataset(x, y))
    assert data_fingerprint(TensorDataset(x, y)) == data_fingerprint(
        DataLoader(TensorDataset(x, y), batch_size=8)
    )


def test_values_order_shape_and_dtype_change_it():
    x, y = xy()
    base = data_fingerprint((x, y))
    nudged = x.clone()
    nudged[17, 2] += 1e-6
    assert data_fingerprint((nudged, y)) != base
    assert data_fingerprint((x.flip(0), y.flip(0))) != base
    assert data_fingerprint((x.reshape(40, 3, 1), y)) != base
    assert data_fingerprint((x.double(), y)) != base
    assert data_fingerprint(xy(41)) != base


class Items(torch.utils.data.Dataset):
    """A map-style data set of ``(x, y)`` that records which items were read."""

    def __init__(self, x, y, delay=0.0):
        self.x, self.y, self.delay, self.read = x, y, delay, []

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        self.read.append(i)
        if self.delay:
            import time

            time.sleep(self.delay)
        return self.x[i], self.y[i]


def test_a_small_dataset_is_read_in_full_so_any_changed_item_changes_it():
    """Labels flipped or items reordered anywhere in a data set that reads in a few seconds
    change its fingerprint (three items were once all that was read)."""
    x, y = xy(200)
    base = Items(x, y)
    print_ = data_fingerprint(base)
    assert sorted(base.read) == list(range(200)) and "sample" not in print_
    assert print_["size"] == 200 and print_["shapes"] == [[[3], "float32"], [[], "int64"]]
    flipped = y.clone()
    flipped[1:99:2] = 3 - flipped[1:99:2]  # 49 labels of the first half
    assert data_fingerprint(Items(x, flipped)) != print_
    order = torch.randperm(200, generator=torch.Generator().manual_seed(1))
    assert data_fingerprint(Items(x[order], y[order])) != print_
    assert data_fingerprint(Items(x, y)) == print_


def test_a_slow_dataset_is_sampled_and_says_so(monkeypatch):
    import zoo.data.fingerprint as fingerprint

    monkeypatch.setattr(fingerprint, "FULL_READ_SECONDS", 0.05)
    monkeypatch.setattr(fingerprint, "SAMPLE_ITEMS", 16)
    x, y = xy(400)
    slow = Items(x, y, delay=0.002)
    print_ = data_fingerprint(slow)
    assert print_["sample"] == 16 and print_["size"] == 400
    assert {0, 399} <= set(slow.read)
    assert data_fingerprint(Items(x, y, delay=0.002)) == print_  # the same items: the same
    changed = y.clone()
    changed[399] = 3 - changed[399]  # the last item is always in the sample
    assert data_fingerprint(Items(x, changed, delay=0.002)) != print_


def test_a_dataset_may_say_what_it_is():
    class Named(Items):
        def fingerprint(self):
            return "imagenet-2012-val, version 3"

    x, y = xy()
    named = Named(x, y)
    print_ = data_fingerprint(named)
    assert named.read == [] and print_["size"] == 40
    assert print_ != data_fingerprint(Items(x, y))

    class Wrong(Items):
        def fingerprint(self):
            return 42

    import pytest

    with pytest.raises(TypeError, match="must return a string or bytes"):
        data_fingerprint(Wrong(x, y))


def test_a_transposed_tensor_is_hashed_without_a_copy_of_it(monkeypatch):
    """The same digest as its contiguous copy, from blocks of rows of at most BLOCK_BYTES."""
    import zoo.data.fingerprint as fingerprint

    x = torch.randn(64, 300).t()  # (300, 64), not contiguous
    y = torch.randn(300)
    want = data_fingerprint((x.contiguous(), y))
    monkeypatch.setattr(fingerprint, "BLOCK_BYTES", 4096)
    sizes = []
    real = torch.Tensor.contiguous

    def spy(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        sizes.append(out.numel() * out.element_size())
        return out

    monkeypatch.setattr(torch.Tensor, "contiguous", spy)
    assert data_fingerprint((x, y)) == want
    assert sizes and max(sizes) <= 4096


def test_a_fit_and_its_saved_file_say_what_data_it_was_fitted_to(tmp_path):
    import zoo
    from zoo.models import BayesianMLP

    x, y = xy()
    fit = zoo.fit(BayesianMLP(3, (4,), noise=1.0), "diagonal", (x, y.float()), num_steps=2,
                  run=zoo.Run(progress=False))  # fmt: skip
    assert fit.options["data"] == data_fingerprint((x, y.float()))
    assert zoo.load(fit.save(tmp_path / "fit.pt")).options["data"] == fit.options["data"]
