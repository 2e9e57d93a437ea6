"""zoo.lightning.BayesianModule under lightning.Trainer: two ddp ranks (started by Lightning from
tests/zoo/distributed_runs.py), conversion to and from FitResult, resuming from a checkpoint."""

from __future__ import annotations

import pytest
import torch

import zoo
from tests.zoo.distributed_runs import launch, results
from tests.zoo.linear_gaussian import correlated_data, model_for

pytestmark = pytest.mark.slow  # runs Lightning's Trainer

pytest.importorskip("lightning")


def test_the_trainer_route_fits_lenet_on_two_ranks_and_converts_to_a_fit_result(
    tmp_path, mnist_root
):
    """BayesianModule under lightning.Trainer(strategy="ddp", devices=2, ModelCheckpoint):
    identical guides on both ranks, logged ELBO, KL and validation metrics, a checkpoint that
    loads without unpickling, trainer.predict, and a FitResult that predicts."""
    rc, output = launch("trainer", tmp_path, 8, data=mnist_root)
    assert rc == 0, output[-3000:]
    assert "all_gather is deprecated" not in output  # the validation gathers: the current API
    r0, r1 = results(tmp_path, "trainer")
    assert r0["steps"] == 8
    for name, value in r0["params"].items():
        assert torch.equal(value, r1["params"][name]), name
    assert r0["probs"].shape == (10, 10) and torch.allclose(r0["probs"].sum(-1), torch.ones(10))
    assert r0["trainer_predict"] == [torch.Size([32, 10])]  # 64 test images, 32 per rank
    (checkpoint,) = (tmp_path / "ckpt").glob("*.ckpt")
    state = torch.load(checkpoint, weights_only=True)["state_dict"]
    assert any(k.startswith("guide.") for k in state) and state.keys() >= {
        f"guide.{n}" for n in r0["params"]
    }
    header, *rows = (tmp_path / "logs" / "version_0" / "metrics.csv").read_text().splitlines()
    for column in ("train/elbo", "train/kl", "val/accuracy", "val/nll", "val/ece"):
        assert column in header.split(",")
    assert len(rows) >= 4


def test_a_fit_result_converts_to_a_module_and_back():
    from zoo.lightning import BayesianModule

    x, y = correlated_data(n=40, d=3)
    fit = zoo.fit(
        model_for(3),
        "diagonal",
        (x, y),
        num_steps=3,
        run=zoo.Run(progress=False),
    )
    module = BayesianModule.from_fit_result(fit, num_data=40, example=(x, y))
    assert module.guide is fit.guide and module.model is fit.model
    assert module.kl(x[:4], y[:4]) > 0
    back = module.to_fit_result()
    assert back.guide is fit.guide and back.options["trainer"] == "lightning"
    with pytest.raises(ValueError, match="example="):
        BayesianModule(model_for(3), "diagonal", num_data=40)  # regression: no made-up batch


@pytest.mark.filterwarnings("ignore::lightning.fabric.utilities.warnings.PossibleUserWarning")
@pytest.mark.filterwarnings("ignore:You're resuming from a checkpoint that ended before")
@pytest.mark.filterwarnings("ignore:.*treespec:FutureWarning")  # Lightning 2.6 on torch 2.14
@pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty")
def test_a_trainer_resumes_the_module_from_its_lightning_checkpoint(tmp_path, mnist_root):
    """Trainer(ckpt_path=...) restores the guide, the optimiser and the loss history (Lightning's
    advice about validation loops and mid-epoch checkpoints is silenced here)."""
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint
    from torch.utils.data import DataLoader

    from zoo.lightning import BayesianModule

    train = zoo.data.mnist(mnist_root, limit=64)

    def run(steps: int, folder: str, module, ckpt_path=None):
        trainer = L.Trainer(
            accelerator="cpu",
            devices=1,
            max_steps=steps,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[ModelCheckpoint(dirpath=tmp_path / folder, save_last=True)],
        )
        trainer.fit(module, DataLoader(train, batch_size=16), ckpt_path=ckpt_path)
        return trainer

    def module():
        return BayesianModule(zoo.models.LeNet5(hidden=10), "diagonal", len(train))

    first = module()
    run(4, "a", first)
    resumed = module()
    trainer = run(6, "a", resumed, ckpt_path=tmp_path / "a" / "last.ckpt")
    assert trainer.global_step == 6 and resumed.losses[:4] == first.losses
    assert len(resumed.to_fit_result().losses) == 6


@pytest.mark.parametrize(
    "threads, threshold, expected",
    [("auto", None, 1), ("auto", 1000, 2), (3, None, 3), (None, None, 2)],
)
@pytest.mark.filterwarnings("ignore::lightning.fabric.utilities.warnings.PossibleUserWarning")
@pytest.mark.filterwarnings("ignore:.*treespec:FutureWarning")  # Lightning 2.6 on torch 2.14
def test_the_trainer_route_takes_the_fits_thread_rule_and_restores_the_count(
    threads, threshold, expected, monkeypatch
):
    """BayesianModule(threads=...) sets torch's intra-op threads as zoo.fit's rule decides, from
    the first batch to teardown (a small network: one thread), and leaves the caller's count
    after. The rule weighs the loader's minibatch of 16, not the example of two: with the
    threshold at 1,000 FLOP the two examples (448) are small and the minibatch (3,584) is not."""
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    from zoo.lightning import BayesianModule

    if threshold is not None:
        monkeypatch.setattr(zoo.runtime.threads, "SMALL_STEP_FLOPS", threshold)
    x, y = torch.randn(32, 13), torch.randn(32)
    model = zoo.models.BayesianMLP(13, (8,), noise=1.0)
    module = BayesianModule(model, "diagonal", len(x), example=(x, y), threads=threads)
    seen = []
    step = module.training_step
    module.training_step = lambda *a: (seen.append(torch.get_num_threads()), step(*a))[1]
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        trainer = L.Trainer(
            accelerator="cpu",
            devices=1,
            max_steps=3,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            enable_checkpointing=False,
        )
        trainer.fit(module, DataLoader(TensorDataset(x, y), batch_size=16))
        assert seen == [expected] * 3 and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ValueError, match="threads"):
        BayesianModule(model, "diagonal", len(x), example=(x, y), threads=0)


@pytest.mark.filterwarnings("ignore::lightning.fabric.utilities.warnings.PossibleUserWarning")
@pytest.mark.filterwarnings("ignore:.*treespec:FutureWarning")  # Lightning 2.6 on torch 2.14
def test_the_trainer_route_keeps_batch_norm_statistics_as_pytorch_does(tmp_path):
    """A ResNet through lightning.Trainer: each training step moves the running statistics
    once (the guide's set-up and the KL log do not), validation reads them without moving them,
    and they travel with the module's checkpoint."""
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    from zoo.lightning import BayesianModule

    x = torch.randn(48, 1, 12, 12, generator=torch.Generator().manual_seed(0))
    data = TensorDataset(x, (x.mean((1, 2, 3)) > 0).long())
    model = zoo.models.ResNet(depth=8, in_channels=1, width=4, input_size=12)
    module = BayesianModule(model, "diagonal", len(data), num_samples=2)
    assert int(model.net.bn1.num_batches_tracked) == 0
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=3, logger=False, log_every_n_steps=1,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        num_sanity_val_steps=0, val_check_interval=3,
    )  # fmt: skip
    trainer.fit(module, DataLoader(data, batch_size=16), DataLoader(data, batch_size=16))
    assert int(model.net.bn1.num_batches_tracked) == 3
    assert "val/accuracy" in trainer.callback_metrics
    trainer.save_checkpoint(tmp_path / "m.ckpt")
    state = torch.load(tmp_path / "m.ckpt", weights_only=False)["state_dict"]
    assert torch.equal(state["model.net.bn1.running_mean"], model.net.bn1.running_mean)
