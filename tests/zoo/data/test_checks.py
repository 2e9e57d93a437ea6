"""Every data form becomes the same tensors (zoo.data.checks.gather_tensors)."""

import warnings

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from zoo.data.checks import gather_tensors

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


class _Items(torch.utils.data.Dataset):
    """50 items; item ``bad`` has label 7 (of 2 classes) or a NaN input."""

    def __init__(self, bad=33, kind="label"):
        self.bad, self.kind = bad, kind

    def __len__(self):
        return 50

    def __getitem__(self, i):
        x = torch.full((3,), float(i) / 50)
        if i == self.bad and self.kind == "nan":
            x[1] = float("nan")
        label = 7 if i == self.bad and self.kind == "label" else i % 2
        return x, torch.tensor(label)


class _Stream(torch.utils.data.IterableDataset):
    def __len__(self):
        return 40

    def __iter__(self):
        for i in range(40):
            yield torch.randn(3), torch.tensor(7 if i == 25 else i % 2)


@pytest.mark.parametrize("kind, message", [("label", "got 7 at item 33"), ("nan", "at item 33")])
@pytest.mark.parametrize("form", ["dataset", "shuffled_loader"])
def test_a_dataset_is_checked_before_training_and_the_item_is_named(kind, message, form):
    import zoo

    data = _Items(kind=kind)
    if form == "shuffled_loader":
        data = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
    model = zoo.models.BayesianMLP(3, (4,), 2, task="classification")
    steps = []
    with pytest.raises(ValueError, match=message):
        zoo.fit(
            model,
            "diagonal",
            data,
            num_steps=3,
            run=zoo.Run(progress=False, callbacks=[steps.append]),
        )
    assert not steps  # before the first step


def test_an_iterable_dataset_is_checked_batch_by_batch():
    import zoo

    model = zoo.models.BayesianMLP(3, (4,), 2, task="classification")
    loader = torch.utils.data.DataLoader(_Stream(), batch_size=10)
    with pytest.raises(ValueError, match="batch 2 of the data.*got 7"):
        zoo.fit(
            model,
            "diagonal",
            loader,
            num_steps=5,
            run=zoo.Run(progress=False),
        )


@pytest.mark.parametrize(
    "noise, message",
    [
        (0.1, "times the fixed observation noise.*Standardise y"),
        ("learned", "times the scale of the learned noise's HalfNormal prior.*Standardise y"),
    ],
)
def test_targets_on_a_scale_that_dwarfs_the_noise_are_flagged(noise, message):
    import zoo

    x = torch.randn(60, 2)
    y = 77 * x[:, 0]
    model = zoo.models.BayesianMLP(2, (4,), 1, noise=noise)
    with pytest.warns(UserWarning, match=message):
        zoo.fit(
            model,
            "diagonal",
            (x, y),
            num_steps=1,
            run=zoo.Run(progress=False),
        )
    standardised = zoo.models.BayesianMLP(2, (4,), 1, noise=noise, noise_prior_scale=100.0)
    if noise == "learned":  # a prior on the targets' own scale is quiet
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            zoo.fit(
                standardised,
                "diagonal",
                (x, y),
                num_steps=1,
                run=zoo.Run(progress=False),
            )


def test_real_valued_targets_on_a_classifier_hint_at_task():
    import zoo

    model = zoo.models.from_module(torch.nn.Linear(2, 1), init="module")
    with pytest.raises(ValueError, match="task='regression'"):
        zoo.fit(
            model,
            "diagonal",
            (torch.randn(8, 2), torch.randn(8)),
            run=zoo.Run(progress=False),
        )


def test_fit_predict_and_evaluate_leave_the_global_random_state_alone():
    import random

    import numpy as np

    import zoo

    x, y = torch.randn(30, 2), torch.randint(0, 2, (30,))
    model = zoo.models.BayesianMLP(2, (4,), 2, task="classification")
    before = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())  # noqa: NPY002
    fit = zoo.fit(model, "diagonal", (x, y), num_steps=3, run=zoo.Run(progress=False), seed=5)
    fit.evaluate((x, y), num_samples=3, progress=False)
    a = fit.predict(x, num_samples=3, seed=1, progress=False).probs
    fit.to_arviz((x, y), num_samples=3, progress=False)
    assert torch.equal(torch.get_rng_state(), before[0])
    assert random.getstate() == before[1]
    assert (np.random.get_state()[1] == before[2]).all()  # noqa: NPY002
    assert torch.equal(a, fit.predict(x, num_samples=3, seed=1, progress=False).probs)
    refit = zoo.fit(model, "diagonal", (x, y), num_steps=3, run=zoo.Run(progress=False), seed=5)
    assert refit.losses == fit.losses  # seeded runs repeat


def test_missing_mnist_files_name_the_root_and_zoo_data(tmp_path, monkeypatch):
    import zoo

    monkeypatch.setenv("ZOO_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=f"not under {tmp_path} \\(from \\$ZOO_DATA\\)"):
        zoo.data.mnist(download=False)
    with pytest.raises(FileNotFoundError, match="root= \\(or the ZOO_DATA"):
        zoo.data.mnist(tmp_path / "elsewhere", download=False)
    with pytest.raises(FileNotFoundError, match=f"raw files in {tmp_path / 'MNIST' / 'raw'}"):
        zoo.data.mnist(download=False)


def test_missing_cifar10_files_name_the_folder_torchvision_reads(tmp_path):
    """torchvision reads CIFAR-10 from <root>/cifar-10-batches-py/, not <root>/CIFAR10/raw."""
    import zoo

    with pytest.raises(FileNotFoundError, match="batches in .*cifar-10-batches-py") as err:
        zoo.data.cifar10(tmp_path, download=False)
    assert "CIFAR10/raw" not in str(err.value)


class _Faulty(torch.utils.data.Dataset):
    """40 items; item 13 raises, or has a longer x, or is not a pair."""

    def __init__(self, kind):
        self.kind = kind

    def __len__(self):
        return 40

    def __getitem__(self, i):
        if i == 13 and self.kind == "raises":
            raise KeyError("record 13 is missing")
        x = torch.zeros(4 if i == 13 and self.kind == "shape" else 3)
        if i == 13 and self.kind == "single":
            return x
        return x, torch.tensor(i % 2)


@pytest.mark.parametrize(
    "kind, message",
    [
        ("raises", "item 13 of the data set raised KeyError"),
        ("shape", r"item 13 of the data set has shapes x \(4,\)"),
        ("single", "item 13 of the data set is a Tensor, not an \\(x, y\\) pair"),
    ],
)
@pytest.mark.parametrize("form", ["dataset", "loader"])
def test_a_faulty_dataset_item_is_named_before_training(kind, message, form):
    import zoo

    data = _Faulty(kind)
    if form == "loader":
        data = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
    model = zoo.models.BayesianMLP(3, (4,), 2, task="classification")
    with pytest.raises(ValueError, match=message):
        zoo.fit(
            model,
            "diagonal",
            data,
            num_steps=3,
            run=zoo.Run(progress=False),
        )


class _Flow(torch.utils.data.IterableDataset):
    def __init__(self, length=True):
        self.length = length

    def __iter__(self):
        g = torch.Generator().manual_seed(0)
        for i in range(40):
            yield torch.randn(3, generator=g), torch.tensor(i % 2)

    def __len__(self):
        if not self.length:
            raise TypeError("no length")
        return 40


def test_a_bare_iterable_dataset_is_fitted_in_its_own_order_and_needs_a_length():
    import zoo

    model = zoo.models.BayesianMLP(3, (4,), 2, task="classification")
    fit = zoo.fit(
        model,
        "diagonal",
        _Flow(),
        num_steps=6,
        batch_size=10,
        run=zoo.Run(progress=False),
    )
    assert fit.steps == 6
    with pytest.raises(TypeError, match="IterableDataset with a length.*__len__"):
        zoo.fit(
            model,
            "diagonal",
            _Flow(length=False),
            num_steps=2,
            run=zoo.Run(progress=False),
        )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_half_precision_model_is_refused_with_advice_that_works(dtype):
    import zoo

    x = torch.randn(20, 3)
    model = zoo.models.BayesianMLP(3, (4,), noise=1.0).to(dtype)
    with pytest.raises(TypeError, match="run in float32 or float64.*model.float\\(\\)") as err:
        zoo.fit(model, "diagonal", (x.to(dtype), x[:, 0].to(dtype)), num_steps=2,
                run=zoo.Run(progress=False))  # fmt: skip
    assert "model.to(torch.float16)" not in str(err.value)
    fixed = zoo.fit(model.float(), "diagonal", (x, x[:, 0]), num_steps=2,
                    run=zoo.Run(progress=False))  # fmt: skip
    assert fixed.steps == 2


def test_half_precision_inputs_are_told_to_convert_the_inputs_only():
    import zoo

    x = torch.randn(20, 3)
    with pytest.raises(TypeError, match="X.to\\(torch.float32\\)\\)") as err:
        zoo.fit(zoo.models.BayesianMLP(3, (4,), noise=1.0), "diagonal", (x.half(), x[:, 0]),
                num_steps=2, run=zoo.Run(progress=False))  # fmt: skip
    assert "model.to(torch.float16)" not in str(err.value)


def test_evaluate_names_the_dataset_item_that_raises():
    import zoo

    x = torch.randn(20, 3)
    fit = zoo.fit(zoo.models.BayesianMLP(3, (4,), noise=1.0), "diagonal", (x, x[:, 0]),
                  num_steps=2, run=zoo.Run(progress=False))  # fmt: skip

    class Broken(Dataset):
        def __len__(self):
            return 20

        def __getitem__(self, i):
            if i == 13:
                raise KeyError("missing image")
            return x[i], x[i, 0]

    with pytest.raises(ValueError, match="item 13 of the data set raised KeyError"):
        fit.evaluate(Broken(), progress=False)


def test_a_regression_model_warns_on_integer_targets():
    import zoo

    x = torch.randn(30, 3)
    labels = torch.randint(0, 3, (30,))
    with pytest.warns(UserWarning, match="int64 with 3 distinct values.*task='classification'"):
        zoo.fit(zoo.models.BayesianMLP(3, (4,), noise=1.0), "diagonal", (x, labels),
                num_steps=2, run=zoo.Run(progress=False))  # fmt: skip


class _Tokens(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4)
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, tokens):
        return self.fc(self.emb(tokens).mean(1))


@pytest.mark.parametrize(
    "make, phrase",
    [
        (lambda t: t.index_put_((torch.tensor([7]), torch.tensor([2])), torch.tensor(10)),
         "token id 10 at item 7, outside the embedding's vocabulary \\[0, 10\\)"),
        (lambda t: t.index_put_((torch.tensor([0]), torch.tensor([0])), torch.tensor(-2)),
         "token id -2 at item 0"),
        (lambda t: t[:, :0], "empty sequences"),
        (lambda t: t[:, 0], "cannot take inputs of shape \\(N,\\) and dtype torch.int64"),
        (lambda t: t[:, :, None], "returns outputs of shape \\(N, 1, 3\\).* embeds token ids"),
        (lambda t: t.reshape(20, 5, 1, 1), "outputs of shape \\(N, 1, 1, 3\\).* \\(N, L\\)"),
        (lambda t: t.float(), "dtype torch.float32: .*embeds token ids.* X.long\\(\\)"),
        (lambda t: t.short(), "token indices of dtype torch.int16; the embedding takes int64"),
        (lambda t: t.bool(), "token indices of dtype torch.bool"),
    ],
    ids=["too-large", "negative", "empty", "one-dim", "three-dims", "four-dims", "float",
         "int16", "bool"],
)  # fmt: skip
def test_token_ids_are_checked_against_the_vocabulary_before_any_work(make, phrase):
    import zoo

    tokens = torch.randint(0, 10, (20, 5), generator=torch.Generator().manual_seed(0))
    y = torch.randint(0, 3, (20,))
    bad = make(tokens.clone())
    model = zoo.models.from_module(_Tokens(), init="module")
    steps = []
    with pytest.raises((ValueError, TypeError), match=phrase):
        zoo.fit(model, "diagonal", (bad, y), num_steps=2,
                run=zoo.Run(progress=False, callbacks=[lambda v: steps.append(1)]))  # fmt: skip
    assert steps == []
    fit = zoo.fit(model, "diagonal", (tokens, y), num_steps=1, run=zoo.Run(progress=False))
    if bad.dim() == 2 and bad.shape[1]:
        with pytest.raises((ValueError, TypeError), match=phrase):
            fit.predict(bad, num_samples=2, progress=False)
    dataset = torch.utils.data.TensorDataset(bad, y)
    with pytest.raises((ValueError, TypeError), match=phrase):
        zoo.fit(model, "diagonal", torch.utils.data.DataLoader(dataset, batch_size=8),
                num_steps=2, run=zoo.Run(progress=False))  # fmt: skip
