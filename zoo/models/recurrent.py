"""A recurrent sequence classifier (LSTM or GRU) on PyTorch's fused recurrent kernels.

The network holds PyTorch's own ``nn.LSTM`` or ``nn.GRU`` (batch first), whose parameters are
the sample sites (``rnn.weight_ih_l0``, ``rnn.weight_hh_l0``, ``rnn.bias_ih_l0``,
``rnn.bias_hh_l0``, ...: the gates stacked in PyTorch's order). Each weight draw runs the fused
kernel; several draws at once (``num_particles > 1``, ``sample_batch_size > 1``) run it once per
draw (:func:`zoo.models.statistics.looped_call`), as for a converted ``nn.LSTM``: the fused
kernel has no ``torch.func.vmap`` rule, and per-step matrix products that ``vmap`` could batch
are slower, one draw or several (``benchmarks/recurrent.py`` at ``8edfd97`` measures both).
"""

from __future__ import annotations

import torch
from torch import nn

from zoo.models.base import BayesianModel
from zoo.models.checks import check_sizes
from zoo.models.predictions import ClassificationPrediction
from zoo.priors import Prior

#: The PyTorch module of each cell type.
CELLS = {"lstm": nn.LSTM, "gru": nn.GRU}


class RecurrentNetwork(nn.Module):
    """``layers`` stacked LSTM or GRU layers (PyTorch's fused ``nn.LSTM``/``nn.GRU``, zero
    initial states) over ``(B, T, in_features)`` sequences, then a linear layer on the last
    hidden state: ``(B, num_classes)`` logits."""

    def __init__(self, in_features, hidden=64, num_classes=10, cell="lstm", layers=1):
        if cell not in CELLS:
            raise ValueError(f"cell must be one of {sorted(CELLS)}, got {cell!r}")
        check_sizes("the recurrent layer's sizes", [in_features, hidden, layers])
        super().__init__()
        self.rnn = CELLS[cell](in_features, hidden, num_layers=layers, batch_first=True)
        self.fc = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.rnn(x)[0][:, -1])


class RecurrentClassifier(BayesianModel[ClassificationPrediction]):
    """Bayesian LSTM or GRU classifier of ``(B, T, in_features)`` sequences (sequential MNIST:
    28 rows of 28 pixels). Every weight and bias is a sample site.

    Parameters
    ----------
    in_features : int
        Features per time step.
    hidden : int, default 64
    num_classes : int, default 10
    cell : {"lstm", "gru"}, default "lstm"
    layers : int, default 1
    seq_len : int, optional
        Fixed sequence length, checked before a fit.
    prior : Prior or float, optional
        Weight prior; default ``NormalPrior(1.0)``.
    """

    def __init__(
        self,
        in_features: int,
        hidden: int = 64,
        num_classes: int = 10,
        cell: str = "lstm",
        layers: int = 1,
        seq_len: int | None = None,
        prior: Prior | float | None = None,
    ):
        check_sizes(
            "the classifier's in_features, hidden and num_classes",
            [in_features, hidden, num_classes],
        )
        if seq_len is not None:
            check_sizes("seq_len", [seq_len])
        super().__init__(
            RecurrentNetwork(in_features, hidden, num_classes, cell, layers),
            task="classification",
            prior=prior,
            input_shape=None if seq_len is None else (seq_len, in_features),
        )
        self._args = dict(
            in_features=in_features,
            hidden=hidden,
            num_classes=num_classes,
            cell=cell,
            layers=layers,
            seq_len=seq_len,
        )

    def spec(self) -> dict | None:
        return self._class_spec(**self._args)
