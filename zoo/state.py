"""Deprecated: a running fit's state and checkpoint moved to :mod:`zoo.checkpoint`
(``TrainingState`` is now ``LoopState``)."""

import warnings

from zoo.checkpoint import LoopState, read_checkpoint, restore, write_checkpoint

TrainingState = LoopState

warnings.warn(
    "zoo.state is deprecated: use zoo.checkpoint (TrainingState is now LoopState)",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["LoopState", "TrainingState", "read_checkpoint", "restore", "write_checkpoint"]
