"""``zoo.fit``'s minibatches: the ``data`` argument in any form (tensors, a ``Dataset``, an
``IterableDataset``, a ``DataLoader``) as shuffled batches on the fit's device, a rank's shard of
them in a distributed fit, checked as :mod:`zoo.data.checks` says."""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset

from zoo.data.checks import (
    check_data,
    check_dataset,
    check_finite,
    check_input_shape,
    check_targets,
    check_tokens,
)
from zoo.data.forms import as_tensors, split_batch
from zoo.data.sample import sample_examples
from zoo.models.base import BayesianModel
from zoo.models.statistics import frozen_statistics, training_mode

__all__ = ["Batches", "fit_batches"]


class Batches:
    """Shuffled minibatches of ``(x, y)`` on ``device``; ``len(self)`` is the data size ``N``.

    In-memory tensors (a tuple or a ``TensorDataset``) are moved to the device once and indexed
    there; any other ``Dataset`` goes through a ``DataLoader``; a ``DataLoader`` is used as is.
    Batches of an ``IterableDataset`` are checked as they come (``model``'s likelihood checks
    the targets); every other form is checked before training (:func:`check_dataset`).

    ``shard=(rank, world_size)`` gives this rank its part of every epoch (see
    :mod:`zoo.runtime.distributed`): in-memory tensors split each epoch's shuffle ``world_size``
    ways (padded by wrapping round to equal parts); other data go through a ``DistributedSampler``
    seeded with ``seed`` (a given ``DataLoader`` is rebuilt with its batch size, collate
    function and workers). ``len(self)`` stays the full ``N``.
    """

    def __init__(
        self,
        data,
        batch_size: int,
        device: torch.device,
        generator: torch.Generator,
        model=None,
        shard: tuple[int, int] = (0, 1),
        seed: int = 0,
    ):
        self.model = model
        self.device = device
        self.generator = generator
        self.rank, self.world_size = shard
        self.loader: DataLoader | None = None
        self.sampler: DistributedSampler | None = None
        self.tensors: tuple[torch.Tensor, torch.Tensor] | None = None
        if isinstance(data, DataLoader):
            self.loader = data
            self.size = _dataset_length(data.dataset)
            self.batch_size = data.batch_size or 1
        else:
            tensors = as_tensors(data)
            self.batch_size = int(batch_size)
            if tensors is not None:
                x, y = tensors
                self.tensors = (x.to(device), y.to(device))
                self.size = x.shape[0]
            else:
                self.size = _dataset_length(data)
                stream = isinstance(data, IterableDataset)  # its own order: no index to shuffle
                self.loader = DataLoader(
                    data,
                    batch_size=self.batch_size,
                    shuffle=not stream,
                    generator=None if stream else generator,
                )
        if self.world_size > 1 and self.loader is not None:
            self._shard_loader(seed)

    def _shard_loader(self, seed: int) -> None:
        old = self.data_loader
        dataset = old.dataset
        if isinstance(dataset, IterableDataset):
            raise ValueError(
                "an IterableDataset cannot be split across processes by the fit (it has no "
                "index); pass a map-style Dataset, or fit on one process"
            )
        self.sampler = DistributedSampler(
            dataset, num_replicas=self.world_size, rank=self.rank, shuffle=True, seed=seed
        )
        self.loader = DataLoader(
            dataset,
            batch_size=self.batch_size,
            sampler=self.sampler,
            collate_fn=old.collate_fn,
            num_workers=old.num_workers,
            pin_memory=old.pin_memory,
            persistent_workers=old.persistent_workers if old.num_workers else False,
        )

    def __len__(self) -> int:
        return self.size

    @property
    def check_batches(self) -> bool:
        """Whether batches are checked as they come (an ``IterableDataset``)."""
        return self.loader is not None and isinstance(self.loader.dataset, IterableDataset)

    @property
    def steps_per_epoch(self) -> int:
        if self.loader is not None:
            return len(self.loader)
        return math.ceil(self.per_rank / self.batch_size)

    @property
    def per_rank(self) -> int:
        """Examples each rank sees an epoch (the shards are padded to equal sizes)."""
        return math.ceil(self.size / self.world_size)

    @property
    def minibatch_size(self) -> int:
        """Examples in this rank's largest minibatch: ``batch_size``, or fewer when the rank's
        share of the data is smaller (the size whose forward pass the step rules weigh)."""
        return max(1, min(self.batch_size, self.per_rank))

    def epoch(self, number: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The minibatches of epoch ``number`` (which seeds a ``DistributedSampler``'s shuffle;
        otherwise the shuffling generator's state decides)."""
        if self.tensors is not None:
            x, y = self.tensors
            perm = torch.randperm(self.size, generator=self.generator)
            if self.world_size > 1:
                per_rank = self.per_rank
                perm = perm.repeat(math.ceil(per_rank * self.world_size / self.size))
                perm = perm[: per_rank * self.world_size][self.rank :: self.world_size]
            perm = perm.to(self.device)
            for start in range(0, len(perm), self.batch_size):
                idx = perm[start : start + self.batch_size]
                yield x[idx], y[idx]
            return
        if self.sampler is not None:
            self.sampler.set_epoch(number)
        for index, batch in enumerate(self.data_loader):
            xb, yb = split_batch(batch)
            if self.check_batches:  # an IterableDataset: no pass before training could run
                try:
                    check_finite(xb, "x", "it")
                    check_tokens(self.model, xb, "it")
                    check_finite(yb, "y", "it")
                    check_targets(self.model, yb)
                except ValueError as err:
                    raise ValueError(
                        f"batch {index} of the data (an IterableDataset: items are counted "
                        f"within the batch): {err}"
                    ) from None
            yield xb.to(self.device, non_blocking=True), yb.to(self.device, non_blocking=True)

    @property
    def data_loader(self) -> DataLoader:
        """The loader of data not held as tensors (``loader``; an error when ``tensors`` hold
        them)."""
        if self.loader is None:
            raise RuntimeError("these batches are tensors on the device, not a DataLoader")
        return self.loader

    def sample_inputs(self, count: int, seed: int = 0) -> torch.Tensor:
        """``count`` training inputs (all of them when fewer) on the device, drawn without
        replacement by a generator of their own seeded ``seed``: the fit's generators do not
        move, and every rank draws the same. An ``IterableDataset``, which cannot be indexed,
        gives its first ``count``."""
        x, _ = sample_examples(self.tensors or self.data_loader, count, seed)
        return x.to(self.device)

    def first(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A small batch (for the prototype trace and the shape check)."""
        if self.tensors is not None:
            x, y = self.tensors
            return x[:2], y[:2]
        loader = self.data_loader
        probe = DataLoader(loader.dataset, batch_size=2, collate_fn=loader.collate_fn)
        xb, yb = split_batch(next(iter(probe)))
        return xb.to(self.device), yb.to(self.device)


def _dataset_length(dataset) -> int:
    try:
        return len(dataset)
    except TypeError:
        stream = isinstance(dataset, IterableDataset)
        raise TypeError(
            f"fit needs a{'n IterableDataset' if stream else ' Dataset'} with a length: the data "
            "size N scales the ELBO (each minibatch's likelihood by N / B); give the class a "
            "__len__ returning the number of examples"
            + (" (it is read in its own order: shuffle inside __iter__)" if stream else "")
        ) from None


def batch_order(data) -> dict:
    """How ``zoo.fit`` draws minibatches from ``data``, as a resume must find it: a
    ``DataLoader``'s sampler (``SequentialSampler``, ``RandomSampler`` for ``shuffle=True``, a
    user's), batch sampler and ``drop_last``; for tensors and data sets, the fit's own seeded
    shuffle."""
    if isinstance(data, DataLoader):
        sampler = data.batch_sampler if data.batch_sampler is not None else None
        return {
            "sampler": type(data.sampler).__name__,
            "batch_sampler": None if sampler is None else type(sampler).__name__,
            "drop_last": bool(data.drop_last),
        }
    return {"sampler": "zoo: shuffled with the fit's seed"}


def fit_batches(
    model, data, batch_size: int, device, seed, ranks
) -> tuple[Batches, torch.Generator]:
    """``zoo.fit``'s checked, shuffled minibatches on ``device`` (this rank's shard, for
    ``ranks``: a :class:`zoo.runtime.distributed.Ranks`) and the generator that shuffles them."""
    tensors = as_tensors(data)
    probed = None  # the first rows, once the network has run on them
    if tensors is not None:
        if len(tensors[0]) and len(tensors[0]) == len(tensors[1]):  # the output's width first
            probed = (tensors[0][:2].to(device), tensors[1][:2].to(device))
            check_input_shape(model, *probed)
        check_data(model, *tensors)
    generator = torch.Generator()
    generator.manual_seed(seed if seed is not None else int(torch.randint(2**31, ())))
    shard = (ranks.rank, ranks.world_size)
    batches = Batches(data, batch_size, device, generator, model, shard, seed or 0)
    if len(batches) == 0:
        raise ValueError("the data set is empty: fit needs at least one example")
    if batches.steps_per_epoch == 0:
        loader = batches.data_loader
        raise ValueError(
            f"the data give no minibatch per epoch: a DataLoader with batch_size="
            f"{loader.batch_size} and drop_last={loader.drop_last} over {len(batches)} "
            "examples (on this rank) drops them all; pass a smaller batch_size or "
            "drop_last=False"
        )
    if tensors is None:
        probed = _probe_first_batch(model, batches)
    if tensors is None and not batches.check_batches:
        check_dataset(model, batches.data_loader.dataset, batches.data_loader.collate_fn)
    if probed is None:
        probed = batches.first()
        check_input_shape(model, *probed)
    x0, y0 = probed
    check_batch_of_one(model, batches, x0[:1])
    if isinstance(model, BayesianModel):
        model.likelihood.check_scale(tensors[1] if tensors is not None else y0)
    return batches, generator


def _probe_first_batch(model, batches: Batches):
    """``(x0, y0)``, the first batch of a data set with the network run on it before its items
    are checked, so that the labels are checked against the output's width; ``None`` for a
    broken first item, left to :func:`zoo.data.checks.check_dataset`, which names it."""
    try:
        first = batches.first()
    except Exception:  # noqa: BLE001 (any error of the user's items: reported by the check)
        return None
    check_input_shape(model, *first)
    return first


def smallest_batch(batches: Batches) -> int:
    """The fewest examples a minibatch of an epoch holds on this rank: the last one's when the
    data do not divide into full batches (and it is kept)."""
    loader = batches.loader
    if loader is not None and loader.drop_last:
        return batches.batch_size
    rest = batches.per_rank % batches.batch_size
    return rest or min(batches.batch_size, batches.per_rank)


def check_batch_of_one(model, batches: Batches, x1: torch.Tensor) -> None:
    """Refuse, before any step, a fit whose epochs hold a minibatch of one example when the
    network cannot normalise one in training mode (``BatchNorm1d`` over ``(1, C)``: PyTorch's
    "Expected more than 1 value per channel" after the steps before it), saying which batch
    size would not leave one."""
    if smallest_batch(batches) != 1 or not isinstance(model, BayesianModel):
        return
    try:
        with torch.no_grad(), frozen_statistics(), training_mode(model):
            model.network(x1, model.net_means(copy=False))
    except ValueError as err:
        if "more than 1 value per channel" not in str(err):
            raise
        n, b = batches.per_rank, batches.batch_size
        if b == 1:
            advice = "use batch_size=2 or more"
        else:
            advice = (
                f"{n} examples at batch_size={b} leave a last batch of 1: use "
                f"batch_size={b + 1} or {b - 1}, drop one example, or pass a DataLoader with "
                "drop_last=True"
            )
        raise ValueError(
            f"a minibatch of one example reaches the network's batch norm, which cannot "
            f"normalise a single value per channel in training mode; {advice}"
        ) from None
