"""The zoo's RecurrentClassifier against a user's nn.LSTM classifier converted with
``from_module``, and against the per-step cell the zoo's network was written with before
(matrix products per time step, which ``torch.func.vmap`` can batch over draws).

    python benchmarks/recurrent.py                    # LSTM 28 -> 64, sequential MNIST shape
    python benchmarks/recurrent.py --particles 1 4 --rounds 3 --steps 10

One diagonal ``zoo.fit`` step per row, batch 128 of 28 x 28 sequences, one thread, the CPU
time of the process per step (``time.process_time``) read inside the fit's loop; rows
interleaved round by round, medians. The per-step cell is kept here only as the reference it
was measured against: ``vmap`` batches it over the particles, where the fused kernel runs once
per particle (``zoo.models.statistics.looped_call``).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import zoo  # noqa: E402
from zoo.training.options import grouped  # noqa: E402


class CellLSTM(nn.Module):
    """One LSTM layer as per-step matrix products (PyTorch's gates and parameter names)."""

    def __init__(self, input_size: int, hidden_size: int):
        super().__init__()
        self.hidden_size = hidden_size
        bound = 1 / math.sqrt(hidden_size)
        gates = 4 * hidden_size
        shapes = {"weight_ih_l0": (gates, input_size), "weight_hh_l0": (gates, hidden_size),
                  "bias_ih_l0": (gates,), "bias_hh_l0": (gates,)}  # fmt: skip
        for name, shape in shapes.items():
            self.register_parameter(name, nn.Parameter(torch.empty(shape).uniform_(-bound, bound)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inputs = x @ self.weight_ih_l0.T + self.bias_ih_l0
        h = x.new_zeros(x.shape[0], self.hidden_size)
        c = torch.zeros_like(h)
        for t in range(x.shape[1]):
            gates = inputs[:, t] + h @ self.weight_hh_l0.T + self.bias_hh_l0
            i, f, g, o = gates.chunk(4, dim=-1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
        return h


class UserLSTM(nn.Module):
    """What a user brings: PyTorch's LSTM and a linear layer on the last hidden state."""

    def __init__(self, cell: bool = False):
        super().__init__()
        self.cell = cell
        self.rnn = CellLSTM(28, 64) if cell else nn.LSTM(28, 64, batch_first=True)
        self.fc = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.rnn(x) if self.cell else self.rnn(x)[0][:, -1])


ROWS = {
    "zoo RecurrentClassifier": lambda: zoo.models.RecurrentClassifier(28, hidden=64, seq_len=28),
    "converted nn.LSTM": lambda: zoo.models.from_module(UserLSTM(), task="classification"),
    "per-step cells (vmap), before": lambda: zoo.models.from_module(
        UserLSTM(cell=True), task="classification"
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--particles", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(128, 28, 28, generator=g), torch.randint(0, 10, (128,), generator=g)
    print("| particles | row | ms / step | x converted nn.LSTM |")
    print("| ---: | --- | ---: | ---: |")
    for particles in args.particles:
        models = {name: make() for name, make in ROWS.items()}
        times: dict[str, list[float]] = {name: [] for name in ROWS}
        for _ in range(args.rounds):
            for name, model in models.items():
                stamps: list[float] = []

                def stamp(state, stamps=stamps) -> None:
                    stamps.append(time.process_time())

                options = {"progress": False, "threads": 1, "num_particles": particles,
                           "callbacks": [stamp]}  # fmt: skip
                zoo.fit(model, "diagonal", (x, y), num_steps=args.steps + 1, batch_size=128,
                        lr=1e-3, seed=0, **grouped(options))  # fmt: skip
                times[name] += [b - a for a, b in zip(stamps[:-1], stamps[1:])]
        base = statistics.median(times["converted nn.LSTM"])
        for name, t in times.items():
            median = statistics.median(t)
            print(f"| {particles} | {name} | {1e3 * median:.1f} | {median / base:.2f} |")


if __name__ == "__main__":
    main()
