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


def test_a_dataset_is_fingerprinted_from_a_few_items():
    """A map-style Dataset is read at its first, middle and last item only."""
    x, y = xy()
    read = []

    class Spy(torch.utils.data.Dataset):
        def __len__(self):
            return 40

        def __getitem__(self, i):
            read.append(i)
            return x[i], y[i]

    print_ = data_fingerprint(Spy())
    assert sorted(read) == [0, 20, 39]
    assert print_["size"] == 40 and print_["shapes"] == [[[3], "float32"], [[], "int64"]]


def test_a_fit_and_its_saved_file_say_what_data_it_was_fitted_to(tmp_path):
    import zoo
    from zoo.models import BayesianMLP

    x, y = xy()
    fit = zoo.fit(BayesianMLP(3, (4,), noise=1.0), "diagonal", (x, y.float()), num_steps=2,
                  run=zoo.Run(progress=False))  # fmt: skip
    assert fit.options["data"] == data_fingerprint((x, y.float()))
    assert zoo.load(fit.save(tmp_path / "fit.pt")).options["data"] == fit.options["data"]
