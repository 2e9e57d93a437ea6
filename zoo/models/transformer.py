"""A small transformer encoder classifier over token or feature sequences.

Its attention is written with matrix products (no fused kernel), so that ``torch.func.vmap``
batches it over weight draws; its parameters are named as PyTorch's ``nn.MultiheadAttention``'s
(``in_proj_weight``, the packed ``(3 d, d)`` query, key and value projection, ``in_proj_bias``,
``out_proj``), and it computes the same function (tested against it).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from zoo.models.base import BayesianModel
from zoo.models.checks import check_sizes
from zoo.models.convert import deterministic_parameters
from zoo.models.predictions import ClassificationPrediction
from zoo.priors import Prior


class SelfAttention(nn.Module):
    """Multi-head self-attention over ``(B, T, d)``, ``nn.MultiheadAttention``'s parameters
    and initialisation, without dropout or masks."""

    def __init__(self, d_model: int, heads: int):
        if d_model % heads:
            raise ValueError(f"d_model ({d_model}) must be a multiple of heads ({heads})")
        super().__init__()
        self.heads = heads
        self.in_proj_weight = nn.Parameter(torch.empty(3 * d_model, d_model))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * d_model))
        self.out_proj = nn.Linear(d_model, d_model)
        nn.init.xavier_uniform_(self.in_proj_weight)
        nn.init.zeros_(self.out_proj.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (x @ self.in_proj_weight.T + self.in_proj_bias).chunk(3, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d // self.heads), dim=-1)
        return self.out_proj((weights @ v).transpose(1, 2).reshape(b, t, d))


class EncoderBlock(nn.Module):
    """Pre-norm encoder block: ``x + attention(LN(x))``, then ``x + MLP(LN(x))`` (GELU)."""

    def __init__(self, d_model: int, heads: int, ff: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attn = SelfAttention(d_model, heads)
        self.norm2 = nn.LayerNorm(d_model)
        self.ff1 = nn.Linear(d_model, ff)
        self.ff2 = nn.Linear(ff, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.ff2(nn.functional.gelu(self.ff1(self.norm2(x))))


def sinusoidal_positions(length: int, d_model: int) -> torch.Tensor:
    """Vaswani et al.'s fixed positional encoding, ``(length, d_model)``."""
    position = torch.arange(length, dtype=torch.float32).unsqueeze(1)
    rate = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(1e4) / d_model))
    table = torch.zeros(length, d_model)
    table[:, 0::2] = torch.sin(position * rate)
    table[:, 1::2] = torch.cos(position * rate)[:, : d_model // 2]
    return table


class TransformerNetwork(nn.Module):
    """Embedding (``nn.Embedding`` of ``vocab_size`` tokens, or ``nn.Linear`` of
    ``in_features``) plus fixed positions, ``layers`` encoder blocks, a final layer norm, the
    mean over positions, a linear layer to ``num_classes``."""

    positions: torch.Tensor  # a buffer, (max_len, d_model)

    def __init__(
        self,
        in_features=None,
        vocab_size=None,
        num_classes=10,
        d_model=32,
        heads=4,
        layers=2,
        ff=64,
        max_len=512,
    ):
        if (in_features is None) == (vocab_size is None):
            raise ValueError(
                "give exactly one of in_features (feature sequences) and vocab_size "
                "(token sequences)"
            )
        given = [v for v in (in_features, vocab_size) if v is not None]
        check_sizes(
            "the transformer's sizes", [*given, num_classes, d_model, heads, layers, ff, max_len]
        )
        super().__init__()
        tokens = vocab_size is not None
        self.embed = (
            nn.Embedding(vocab_size, d_model) if tokens else nn.Linear(in_features, d_model)
        )
        self.register_buffer("positions", sinusoidal_positions(max_len, d_model), persistent=False)
        self.blocks = nn.Sequential(*(EncoderBlock(d_model, heads, ff) for _ in range(layers)))
        self.norm = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        if h.shape[-2] > self.positions.shape[0]:
            raise ValueError(f"sequences of {h.shape[-2]} exceed max_len={self.positions.shape[0]}")
        h = self.blocks(h + self.positions[: h.shape[-2]])
        return self.fc(self.norm(h).mean(-2))


class TransformerClassifier(BayesianModel[ClassificationPrediction]):
    """Bayesian transformer encoder classifier of ``(B, T, in_features)`` feature sequences
    (sequential MNIST: ``T = 28`` rows of 28 pixels) or ``(B, T)`` token indices.

    Linear, embedding and attention weights and biases are sample sites; the layer norms'
    parameters are deterministic (point estimates fitted with the ELBO).

    Parameters
    ----------
    in_features : int, optional
        Features per position (exactly one of this and ``vocab_size``).
    vocab_size : int, optional
        Number of tokens: inputs are int64 indices.
    num_classes : int, default 10
    d_model, heads, layers, ff : int, default 32, 4, 2, 64
        Width, attention heads, encoder blocks, hidden width of each block's MLP.
    seq_len : int, optional
        Fixed sequence length, checked before a fit (any length up to ``max_len`` otherwise).
    max_len : int, default 512
    prior : Prior or float, optional
        Weight prior; default ``NormalPrior(1.0)``.
    """

    def __init__(
        self,
        in_features: int | None = None,
        vocab_size: int | None = None,
        num_classes: int = 10,
        d_model: int = 32,
        heads: int = 4,
        layers: int = 2,
        ff: int = 64,
        seq_len: int | None = None,
        max_len: int = 512,
        prior: Prior | float | None = None,
    ):
        net = TransformerNetwork(
            in_features, vocab_size, num_classes, d_model, heads, layers, ff, max_len
        )
        shape: tuple[int, ...] | None = None
        if seq_len is not None:
            check_sizes("seq_len", [seq_len])
            shape = (seq_len,) if in_features is None else (seq_len, in_features)
        super().__init__(
            net,
            task="classification",
            prior=prior,
            input_shape=shape,
            deterministic=deterministic_parameters(net, None, ()),
        )
        self._args = dict(
            in_features=in_features,
            vocab_size=vocab_size,
            num_classes=num_classes,
            d_model=d_model,
            heads=heads,
            layers=layers,
            ff=ff,
            seq_len=seq_len,
            max_len=max_len,
        )

    def spec(self) -> dict | None:
        return self._class_spec(**self._args)
