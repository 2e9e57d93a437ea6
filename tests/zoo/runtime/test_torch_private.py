"""zoo.runtime.torch_private: the private PyTorch names, wrapped once, cover the layers the zoo
means, and their public fallbacks do the same."""

import importlib

import pytest
import torch
from torch import nn

from zoo.runtime import torch_private

NORMS = [nn.BatchNorm1d(3), nn.BatchNorm2d(3), nn.BatchNorm3d(3), nn.SyncBatchNorm(3),
         nn.InstanceNorm1d(3), nn.InstanceNorm2d(3), nn.LazyBatchNorm1d()]  # fmt: skip
DROPOUTS = [nn.Dropout(), nn.Dropout1d(), nn.Dropout2d(), nn.Dropout3d(), nn.AlphaDropout(),
            nn.FeatureAlphaDropout()]  # fmt: skip
OTHERS = [nn.LayerNorm(3), nn.GroupNorm(1, 3), nn.Linear(3, 3), nn.ReLU()]


def test_the_layer_classes_are_the_norms_with_statistics_and_the_dropouts():
    assert all(isinstance(m, torch_private.NORM_LAYERS) for m in NORMS)
    assert all(isinstance(m, torch_private.DROPOUT_LAYERS) for m in DROPOUTS)
    assert not any(isinstance(m, torch_private.NORM_LAYERS) for m in OTHERS + DROPOUTS)
    assert not any(isinstance(m, torch_private.DROPOUT_LAYERS) for m in OTHERS + NORMS)


def test_where_pytorch_moves_the_private_bases_the_public_classes_serve(monkeypatch):
    monkeypatch.delattr(nn.modules.batchnorm, "_NormBase")
    monkeypatch.delattr(nn.modules.dropout, "_DropoutNd")
    monkeypatch.delattr(torch, "_foreach_copy_")
    fallback = importlib.reload(torch_private)
    try:
        assert all(isinstance(m, fallback.NORM_LAYERS) for m in NORMS)
        assert all(isinstance(m, fallback.DROPOUT_LAYERS) for m in DROPOUTS)
        assert not any(isinstance(m, fallback.NORM_LAYERS) for m in OTHERS)
        dst, src = [torch.zeros(3), torch.zeros(2, 2)], [torch.arange(3.0), torch.ones(2, 2)]
        fallback.copy_tensors(dst, src)
        assert torch.equal(dst[0], src[0]) and torch.equal(dst[1], src[1])
    finally:
        monkeypatch.undo()
        importlib.reload(torch_private)


def test_copy_tensors_copies_in_place_and_refuses_unequal_lists():
    dst = [torch.zeros(4, requires_grad=True), torch.zeros(2)]
    keep = [t.data_ptr() for t in dst]
    with torch.no_grad():
        torch_private.copy_tensors(dst, [torch.full((4,), 2.0), torch.ones(2)])
    assert [t.data_ptr() for t in dst] == keep and dst[0].tolist() == [2.0] * 4
    with pytest.raises(ValueError, match="2 destinations for 1 sources"):
        torch_private.copy_tensors(dst, [torch.ones(4)])
