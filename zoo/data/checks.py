"""The checks of the data in every form ``zoo.fit``, ``predict`` and ``evaluate`` take, run before
any training step (what, where: the item index, and how to fix it). The forms themselves, and
their conversion to tensors, are :mod:`zoo.data.forms`'; the minibatches
:mod:`zoo.data.batches`'."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader

from zoo.data.forms import Data, as_tensors, gather_tensors, locate_bad_item, split_batch
from zoo.models.base import BayesianModel
from zoo.models.likelihoods import check_labels, shape_n
from zoo.models.statistics import evaluation_mode

__all__ = [
    "Data",
    "as_tensors",
    "check_data",
    "check_dataset",
    "check_finite",
    "check_input_shape",
    "check_inputs",
    "check_labelled_data",
    "check_labels",
    "check_targets",
    "check_tokens",
    "gather_tensors",
    "split_batch",
]


#: Floating-point types a fit does not run in.
HALF = (torch.float16, torch.bfloat16)


def first_bad_row(bad: torch.Tensor) -> int:
    """The first row (item) of a boolean tensor ``(N, ...)`` that holds a ``True``."""
    return int(bad.reshape(bad.shape[0], -1).any(-1).nonzero()[0]) if bad.dim() else 0


def check_finite(t: torch.Tensor, label: str, where: str = "the data", offset: int = 0) -> None:
    """Refuse NaN or infinite values, naming the first item (``offset`` + its row)."""
    if t.is_floating_point() or t.is_complex():
        bad = ~torch.isfinite(t)
        if bad.any():
            first = first_bad_row(bad)
            raise ValueError(
                f"{label} in {where} contains NaN or infinite values (first at item "
                f"{offset + first}); remove or impute them before fitting"
            )


def vocabulary(model) -> int | None:
    """The number of rows of the network's first embedding (``nn.Embedding`` or
    ``nn.EmbeddingBag`` in module order: the one that reads the input tokens), or ``None``."""
    net = getattr(model, "net", None)
    if not isinstance(model, BayesianModel) or net is None:
        return None
    for module in net.modules():
        if isinstance(module, (torch.nn.Embedding, torch.nn.EmbeddingBag)):
            return int(module.num_embeddings)
    return None


def check_tokens(model, x: torch.Tensor, where: str = "the data", offset: int = 0) -> None:
    """Token indices for a network with an embedding: at least one position per example and
    every id in ``[0, num_embeddings)``; an error names the first bad item (``offset`` + its
    row), the id and the vocabulary's size. Floating-point inputs are not tokens: left alone."""
    vocab = vocabulary(model)
    if vocab is None or x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
        return
    if x.dim() >= 2 and x.shape[1] == 0:
        raise ValueError(
            f"X in {where} holds empty sequences (shape {tuple(x.shape)}): every example "
            "needs at least one token; pad short sequences with the embedding's padding_idx"
        )
    if x.numel() == 0:
        return
    bad = (x < 0) | (x >= vocab)
    if bad.any():
        row = first_bad_row(bad)
        value = int(x.reshape(x.shape[0], -1)[row][bad.reshape(x.shape[0], -1)[row]][0])
        raise ValueError(
            f"X in {where} holds the token id {value} at item {offset + row}, outside the "
            f"embedding's vocabulary [0, {vocab}): ids must be 0 to {vocab - 1} (map unknown "
            "tokens to an id of their own, or build the embedding with more rows)"
        )


def check_dataset(model, dataset, collate_fn=None, batch_size: int = 1024) -> None:
    """One pass over a map-style ``Dataset``, in order, before training: every item must be an
    ``(x, y)`` pair of finite values whose targets the model's likelihood takes; an error
    names the item index. This costs one pass of data loading; in-memory tensors are checked
    without one, and an ``IterableDataset`` (no index) is checked batch by batch instead."""
    loader = iter(DataLoader(dataset, batch_size=batch_size, collate_fn=collate_fn))
    offset = 0
    while True:
        try:
            batch = next(loader)
        except StopIteration:
            break
        except Exception as err:  # an item that raises, or items that do not stack
            locate_bad_item(dataset, offset, min(offset + batch_size, len(dataset)), err)
            raise
        xb, yb = split_batch(batch)
        check_finite(xb, "x", "the data set", offset)
        check_tokens(model, xb, "the data set", offset)
        check_finite(yb, "y", "the data set", offset)
        check_targets(model, yb, offset)
        offset += xb.shape[0]


def check_data(model, x: torch.Tensor, y: torch.Tensor) -> None:
    """Every check that can run on in-memory data before training."""
    if x.shape[0] == 0:
        raise ValueError("the data set is empty: it has no examples")
    check_finite(x, "X")
    check_tokens(model, x)
    check_finite(y, "y")
    check_targets(model, y)


def check_targets(model, y: torch.Tensor, offset: int = 0) -> None:
    """The target values, as the model's likelihood wants them (labels in range, ...); an
    error names the item (``offset`` + its row)."""
    if isinstance(model, BayesianModel):
        model.likelihood.check_targets(y, model.out_features, offset)


def check_labelled_data(model, x: torch.Tensor, y: torch.Tensor, device: torch.device) -> None:
    """Held-out ``(x, y)`` for evaluation: the checks fit runs on its data (values, labels) and
    the input and target shapes, probed on two examples on ``device``."""
    check_input_shape(model, x[:2].to(device), y[:2].to(device))  # first: the class count
    check_data(model, x, y)


def check_inputs(model, x: torch.Tensor, device: torch.device | None = None) -> None:
    """Inputs to predict from: a non-empty floating-point tensor of finite values that the
    model's network takes (run once on two examples, on ``device``)."""
    if not torch.is_tensor(x):
        raise TypeError(f"x must be a torch tensor, got {type(x).__name__}; use torch.as_tensor")
    if x.dim() == 0 or x.shape[0] == 0:
        raise ValueError(f"x has no examples (shape {tuple(x.shape)})")
    check_finite(x, "x")
    check_tokens(model, x, "x")
    probe = x[:2] if device is None else x[:2].to(device)
    check_input_shape(model, probe)


def check_input_shape(model, x: torch.Tensor, y: torch.Tensor | None = None) -> None:
    """Run the model's network once on two examples; turn a shape error into a clear message.
    With ``y``, also check the shape of regression targets against the network's output."""
    if not isinstance(model, BayesianModel):
        return
    weight = next(model.net.parameters(), None)
    tokens = model.takes_tokens and not x.is_floating_point() and not x.is_complex()
    if tokens and x.dtype not in (torch.int64, torch.int32):
        raise TypeError(
            f"X holds token indices of dtype {x.dtype}; the embedding takes int64 (X.long())"
        )
    if not tokens and not x.is_floating_point():
        raise TypeError(f"X must be a floating-point tensor, got {x.dtype}; use X.float()")
    if tokens:
        check_tokens(model, x)  # the first rows, before the embedding sees them
    if weight is not None and weight.dtype in HALF:
        raise TypeError(
            f"the model's weights are {weight.dtype}: fits and predictions run in float32 or "
            "float64 (half precision loses the ELBO's sums and Adam's moments); use "
            "model.float() and X.float()"
        )
    if weight is not None and not tokens and x.dtype != weight.dtype:
        advice = f"X.to({weight.dtype})"
        if x.dtype not in HALF:
            advice += f" or model.to({x.dtype})"
        raise TypeError(
            f"X is {x.dtype} but the model's weights are {weight.dtype}; convert one of them "
            f"({advice})"
        )
    expected = model.input_shape
    if expected is not None and tuple(x.shape[1:]) != expected:
        raise ValueError(
            f"the model expects inputs of shape {shape_n(expected)}, got {shape_n(x.shape[1:])}; "
            f"reshape X (e.g. X.view(-1, {', '.join(map(str, expected))}))"
        )
    embeds = model.takes_tokens  # a hint where the network embeds token ids
    hint = ""
    if embeds and (x.is_floating_point() or x.dim() != 2):
        hint = (
            "; the network embeds token ids (an nn.Embedding): it usually takes integer ids of "
            "shape (N, L), X.long()"
        )
    try:
        with torch.no_grad(), evaluation_mode(model):
            out = model.network(x, model.net_means(copy=False))
    except (RuntimeError, IndexError, ValueError) as err:  # the network's own refusal
        raise ValueError(
            f"the model cannot take inputs of shape {shape_n(x.shape[1:])} and dtype "
            f"{x.dtype}: {err}{hint}"
        ) from None
    try:
        model.check_output(out)
    except ValueError as err:
        raise ValueError(f"{err}{hint}") from None
    if y is not None:
        model.likelihood.check_target_shape(y, out)
