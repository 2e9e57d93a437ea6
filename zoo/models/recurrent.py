"""A recurrent sequence classifier (LSTM or GRU) whose cells ``torch.func.vmap`` batches over
weight draws.

PyTorch's ``nn.LSTM`` and ``nn.GRU`` run one fused operation that has no ``vmap`` rule, so a
network holding them evaluates its draws one after another. :class:`Recurrent` computes the
same function with matrix products per time step, with the same parameter names
(``weight_ih_l0``, ``weight_hh_l0``, ``bias_ih_l0``, ``bias_hh_l0``: the gates stacked in
PyTorch's order, ``(4 h, in)`` for the LSTM's i, f, g, o and ``(3 h, in)`` for the GRU's r, z,
n) and initialisation, so its state dict loads into ``nn.LSTM``/``nn.GRU`` and back (tested).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from zoo.models.base import BayesianModel
from zoo.models.checks import check_sizes
from zoo.priors import Prior

#: Gates per cell type.
GATES = {"lstm": 4, "gru": 3}


class Recurrent(nn.Module):
    """``num_layers`` stacked LSTM or GRU layers over ``(B, T, input_size)`` (batch first);
    returns the last layer's outputs ``(B, T, hidden_size)``, zero initial states."""

    def __init__(self, cell: str, input_size: int, hidden_size: int, num_layers: int = 1):
        if cell not in GATES:
            raise ValueError(f"cell must be one of {sorted(GATES)}, got {cell!r}")
        check_sizes("the recurrent layer's sizes", [input_size, hidden_size, num_layers])
        super().__init__()
        self.cell, self.hidden_size, self.num_layers = cell, hidden_size, num_layers
        bound = 1 / math.sqrt(hidden_size)
        g = GATES[cell] * hidden_size
        for k in range(num_layers):
            size = input_size if k == 0 else hidden_size
            for name, shape in (
                ("weight_ih", (g, size)),
                ("weight_hh", (g, hidden_size)),
                ("bias_ih", (g,)),
                ("bias_hh", (g,)),
            ):
                self.register_parameter(
                    f"{name}_l{k}", nn.Parameter(torch.empty(shape).uniform_(-bound, bound))
                )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for k in range(self.num_layers):
            w_ih, w_hh = getattr(self, f"weight_ih_l{k}"), getattr(self, f"weight_hh_l{k}")
            b_ih, b_hh = getattr(self, f"bias_ih_l{k}"), getattr(self, f"bias_hh_l{k}")
            inputs = x @ w_ih.T + b_ih  # every time step's input projection at once
            h = x.new_zeros(x.shape[0], self.hidden_size)
            c = torch.zeros_like(h)
            outputs = []
            for t in range(x.shape[1]):
                if self.cell == "lstm":
                    i, f, g, o = (inputs[:, t] + h @ w_hh.T + b_hh).chunk(4, dim=-1)
                    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                    h = torch.sigmoid(o) * torch.tanh(c)
                else:
                    xr, xz, xn = inputs[:, t].chunk(3, dim=-1)
                    hr, hz, hn = (h @ w_hh.T + b_hh).chunk(3, dim=-1)
                    r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
                    h = (1 - z) * torch.tanh(xn + r * hn) + z * h
                outputs.append(h)
            x = torch.stack(outputs, dim=1)
        return x


class RecurrentNetwork(nn.Module):
    """:class:`Recurrent` over the sequence, then a linear layer on the last hidden state."""

    def __init__(self, in_features, hidden=64, num_classes=10, cell="lstm", layers=1):
        super().__init__()
        self.rnn = Recurrent(cell, in_features, hidden, layers)
        self.fc = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.rnn(x)[:, -1])


class RecurrentClassifier(BayesianModel):
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
