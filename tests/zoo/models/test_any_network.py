"""The networks users bring, through the whole fit: torchvision's ResNet-18 and MobileNet, a
``TransformerEncoder`` classifier, an ``EmbeddingBag`` model and an LSTM classifier, each with
the diagonal, low-rank and matrix-normal families and a mixed guide: it fits, predicts, saves,
loads, and resumes from a checkpoint exactly (running statistics included)."""

import pytest
import torch
import torchvision
from torch import nn

import guides
import zoo


class TransformerText(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(6, 16)
        layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.fc = nn.Linear(16, 3)

    def forward(self, x):
        return self.fc(self.encoder(self.inp(x)).mean(1))


class Bag(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.EmbeddingBag(40, 8)
        self.fc = nn.Linear(8, 3)

    def forward(self, tokens):
        return self.fc(self.emb(tokens))


class LSTMClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(6, 8, batch_first=True)
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc(self.rnn(x)[0][:, -1])


def resnet18():
    return torchvision.models.resnet18(num_classes=3)


def mobilenet():
    return torchvision.models.mobilenet_v3_small(num_classes=3)


# network, an input batch's shape (None: tokens), the last layer's pattern for the mixed guide
NETWORKS = {
    "resnet18": (resnet18, (3, 16, 16), "fc.*"),
    "mobilenet_v3_small": (mobilenet, (3, 32, 32), "classifier.3.*"),
    "transformer_encoder": (TransformerText, (5, 6), "fc.*"),
    "embedding_bag": (Bag, None, "fc.*"),
    "lstm": (LSTMClassifier, (7, 6), "fc.*"),
}
SLOW = {"resnet18", "mobilenet_v3_small"}


def family_for(name: str, family: str, model):
    last = NETWORKS[name][2]
    if family == "mixed":
        return guides.AutoMixed(model, {last: "matrix_normal", "*": "diagonal"})
    if family == "matrix_normal" and name == "resnet18":  # 512 x 4608 kernels: a diagonal B
        return guides.family("matrix_normal", col="diagonal")
    if family == "lowrank" and name == "resnet18":  # 11 million weights: a small rank
        return guides.family("lowrank", rank=2)
    return family


def build(name):
    torch.manual_seed(0)
    return zoo.models.from_module(NETWORKS[name][0](), init="module")


def data(name, n=16):
    gen = torch.Generator().manual_seed(1)
    shape = NETWORKS[name][1]
    x = (
        torch.randint(0, 40, (n, 5), generator=gen)
        if shape is None
        else torch.randn((n, *shape), generator=gen)
    )
    return x, torch.randint(0, 3, (n,), generator=gen)


def fit(name, family, steps, **run):
    model = build(name)
    return zoo.fit(
        model,
        family_for(name, family, model),
        data(name),
        num_steps=steps,
        batch_size=8,
        lr=0.01,
        run=zoo.Run(progress=False, **run),
    )


def fitted_state(result) -> dict:
    state = {f"guide.{k}": v for k, v in result.guide.state_dict().items()}
    state.update({f"model.{k}": v for k, v in result.model.state_dict().items()})
    return state


CASES = [
    pytest.param(net, fam, marks=[pytest.mark.slow] if net in SLOW else [])
    for net in NETWORKS
    for fam in ("diagonal", "lowrank", "matrix_normal", "mixed")
]


@pytest.mark.parametrize("name, family", CASES)
def test_fit_predict_save_load_and_exact_resume(name, family, tmp_path):
    full = fit(name, family, 4)
    assert len(full.losses) == 4 and all(torch.isfinite(torch.tensor(full.losses)))

    def stop(state):
        if state.step == 2:
            raise KeyboardInterrupt

    ckpt = tmp_path / "ckpt.pt"
    part = fit(name, family, 4, checkpoint=ckpt, callbacks=[stop])
    assert part.interrupted and part.steps == 2
    resumed = fit(name, family, 4, resume=ckpt)
    assert resumed.losses == pytest.approx(full.losses, rel=1e-5)
    expected, found = fitted_state(full), fitted_state(resumed)
    assert expected.keys() == found.keys()
    for key, value in expected.items():  # guide, deterministic parameters, statistics
        assert torch.allclose(found[key].double(), value.double(), rtol=1e-4, atol=1e-6), key

    x, _ = data(name, 6)
    pred = full.predict(x, num_samples=3)
    assert pred.probs.shape == (6, 3)
    full.save(tmp_path / "fit.pt")
    loaded = zoo.load(tmp_path / "fit.pt", model=build(name))
    assert torch.allclose(loaded.predict(x, num_samples=3).probs, pred.probs, atol=1e-6)
    for key, value in full.model.state_dict().items():  # running statistics, point estimates
        if key.removeprefix("net.") not in full.model.site_shapes:
            assert torch.equal(loaded.model.state_dict()[key], value), key
