"""The whole library on the new networks: evaluate, ArviZ, Laplace (last layer and
subnetwork), ensembles, ``zoo.compare`` and their saves, on a small ResNet (batch norm) and a
transformer (layer norm)."""

import pytest
import torch

import guides
import zoo
from zoo.models import ResNet, TransformerClassifier

RUN = zoo.Run(progress=False)


def resnet():
    torch.manual_seed(0)
    return ResNet(depth=8, in_channels=1, width=4, input_size=12)


def transformer():
    torch.manual_seed(0)
    return TransformerClassifier(in_features=6, d_model=8, heads=2, layers=1, seq_len=5)


MODELS = {"resnet": (resnet, (1, 12, 12)), "transformer": (transformer, (5, 6))}


def data(name, n=48, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn((n, *MODELS[name][1]), generator=gen)
    y = (x.flatten(1).mean(1) > 0).long() + 2 * (x.flatten(1)[:, 0] > 0).long()
    return x, y


@pytest.mark.parametrize("name", list(MODELS))
def test_evaluate_and_arviz(name):
    fit = zoo.fit(MODELS[name][0](), "lowrank", data(name), num_steps=6, run=RUN)
    metrics = fit.evaluate(data(name, 20, 1), num_samples=4)
    assert 0 <= metrics["accuracy"] <= 1 and metrics["nll"] > 0
    idata = fit.to_arviz(data(name, 10, 1), num_samples=4)
    from zoo.evaluation.arviz import groups_of

    assert "log_likelihood" in groups_of(idata)


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("weights", ["last_layer", "subnetwork"])
def test_laplace(name, weights, tmp_path):
    options = {"weights": weights, "hessian": "full", "subnetwork_size": 20}
    fit = zoo.laplace(MODELS[name][0](), data(name), options=options, num_steps=6, progress=False)
    x, _ = data(name, 10, 1)
    pred = fit.predict(x, num_samples=5)
    assert pred.probs.shape == (10, 10) and torch.isfinite(pred.probs).all()
    fit.save(tmp_path / "laplace.pt")
    loaded = zoo.load(tmp_path / "laplace.pt", model=MODELS[name][0]())
    assert torch.allclose(loaded.predict(x, num_samples=5).probs, pred.probs, atol=1e-5)


def test_ensemble_members_keep_their_own_statistics(tmp_path):
    ens = zoo.ensemble(resnet, data("resnet"), members=2, num_steps=4, progress=False)
    first, second = (m.model.net.bn1.running_mean for m in ens.members)
    assert not torch.equal(first, second)  # a model, with its batch norm, per member
    x, _ = data("resnet", 10, 1)
    pred = ens.predict(x, num_samples=2)
    ens.save(tmp_path / "ens.pt")
    loaded = zoo.load(tmp_path / "ens.pt")
    assert torch.allclose(loaded.predict(x, num_samples=2).probs, pred.probs, atol=1e-6)


def test_compare_on_a_resnet():
    table = zoo.compare(
        resnet,
        ["diagonal", "matrix_normal", "laplace"],
        data("resnet"),
        data("resnet", 20, 1),
        num_samples=3,
        progress=False,
        num_steps=4,
    )
    assert len(table) == 3


def test_the_hmc_reference_refuses_batch_norm_clearly():
    with pytest.raises(ValueError, match="batch norm"):
        zoo.reference(resnet(), data("resnet"), chains=1, warmup=2, draws=2, progress=False)


@pytest.mark.parametrize("family", guides.available())
def test_every_family_fits_and_predicts_a_resnet(family):
    """Batch norm's statistics move with every family's draws and are read in prediction;
    at the end they are re-estimated over an epoch (48 examples: 3 minibatches of 16), whose
    inputs the model keeps for each draw's own statistics; a later fit drops them."""
    model = resnet()
    fit = zoo.fit(model, family, data("resnet"), num_steps=2, batch_size=16, run=RUN)
    assert int(model.net.bn1.num_batches_tracked) == 3 and fit.options["statistics"] == "per_draw"
    assert model.statistics_inputs.shape == (48, 1, 12, 12)
    running = zoo.Run(progress=False, statistics="running")
    zoo.fit(model, family, data("resnet"), num_steps=2, batch_size=16, run=running)
    assert int(model.net.bn1.num_batches_tracked) == 3 + 2  # the steps' running averages
    assert model.statistics_inputs is None
    pred = fit.predict(data("resnet", 8, 1)[0], num_samples=2)
    assert pred.probs.shape == (8, 10) and torch.isfinite(pred.probs).all()
