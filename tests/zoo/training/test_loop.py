"""The loop (zoo.training.loop, zoo.data.batches): every pass over an epoch takes a step or the fit
stops with the reason; it never spins."""

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

import zoo
from zoo.models import BayesianMLP
from zoo.training.loop import DataLengthError


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
    assert isinstance(e.value, DataLengthError)


def test_a_checkpoint_that_cannot_be_written_keeps_the_steps_taken(tmp_path, monkeypatch):
    """A full disk at the first checkpoint: the fit stops with zoo.CheckpointError, whose
    result holds every step taken, and no file or temporary is left behind."""
    import errno

    from zoo.storage import files

    def full(obj, path):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files, "atomic_save", full)
    path = tmp_path / "fit.ckpt"
    with pytest.raises(zoo.CheckpointError, match="at step 10 \\(No space left") as err:
        zoo.fit(BayesianMLP(3, (4,), noise=1.0), "diagonal", data(64), num_steps=30,
                batch_size=16, run=zoo.Run(progress=False, checkpoint=path,
                                           checkpoint_every=10))  # fmt: skip
    assert err.value.errno == errno.ENOSPC
    assert err.value.result.steps == 10 and len(err.value.result.losses) == 10
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    assert err.value.result.save(tmp_path / "kept.pt").exists()


def test_a_loss_that_blows_up_and_stays_there_warns(recwarn):
    """A step that throws the weights far away leaves every loss finite: no divergence test
    fires, so the end of the fit says so."""
    from zoo.training.divergence import LossBlewUpWarning

    def throw(state):
        if state.step == 60:
            with torch.no_grad():
                for name, p in state.result.guide.named_parameters():
                    if "loc" in name and "fc" in name:
                        p.add_(30.0)

    with pytest.warns(LossBlewUpWarning, match="grew from about .* and stayed there .* step 61"):
        zoo.fit(BayesianMLP(3, (8,), noise=1.0), "diagonal", data(64), num_steps=120,
                batch_size=16, lr=1e-4, run=zoo.Run(progress=False, callbacks=[throw]))  # fmt: skip


def test_an_ordinary_fit_does_not_warn_of_a_blow_up():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        zoo.fit(BayesianMLP(3, (8,), noise=1.0), "diagonal", data(64), num_steps=200,
                batch_size=16, lr=1e-2, run=zoo.Run(progress=False))  # fmt: skip
