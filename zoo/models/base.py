"""A Bayesian neural network as a Pyro program built from a plain ``nn.Module``.

Every parameter tensor of the network becomes one sample site named like the parameter
(``fc1.weight``, ``conv1.bias``, ...). The network is evaluated with
``torch.func.functional_call``; weights with leading sample dimensions ``(S, *shape)`` are run as
one vectorised pass (``torch.func.vmap``), so ``S`` posterior draws or ``S`` ELBO particles cost
one batched forward, not a Python loop.

The model's convention, shared with user models that ``zoo.fit`` accepts:

``model(x, y=None)``
    samples every weight, computes the network output, and observes ``y`` inside
    ``pyro.plate("data", len(x))``; returns the network output. The plate holds the *minibatch*
    only: ``zoo.fit`` scales every site inside the ``"data"`` plate by ``N / B`` (full data size
    over batch size), so the minibatch ELBO is an unbiased estimate of the full-data ELBO.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import pyro
import pyro.distributions as dist
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap

from guides.base import fan_in
from zoo.priors import Prior, resolve_prior

TASKS = ("regression", "classification")


class BayesianModel(nn.Module):
    """Pyro model with a sample site over every weight and bias of ``net``.

    Parameters
    ----------
    net : nn.Module
        The architecture. Its own parameter values are never used by the model (they are
        frozen); a guide may use them as initial means (``init_module=model.net``).
    task : {"regression", "classification"}
        ``classification``: ``y`` holds class indices, likelihood ``Categorical(logits=out)``.
        ``regression``: Gaussian likelihood around ``out`` (shape ``(B,)`` for one output,
        ``(B, D)`` for ``D`` outputs).
    prior : Prior or float, optional
        Weight prior (default ``NormalPrior(1.0)``; a number is a Normal prior's scale).
    noise : float or {"learned", "heteroscedastic"}
        Regression only. A float is a fixed observation noise standard deviation;
        ``"learned"`` adds a latent site ``noise`` (a standard deviation) with a
        ``HalfNormal(noise_prior_scale)`` prior; ``"heteroscedastic"`` makes the network predict
        its own noise: ``net`` must output ``2 D`` values, the mean and ``softplus`` of the rest.
    input_shape : tuple, optional
        Shape of one input, used in error messages and checks.
    """

    def __init__(
        self,
        net: nn.Module,
        *,
        task: str = "classification",
        prior: Prior | float | None = None,
        noise: float | str = 0.1,
        noise_prior_scale: float = 1.0,
        input_shape: tuple[int, ...] | None = None,
    ):
        super().__init__()
        if task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {task!r}")
        self.net = net
        self.net.requires_grad_(False)
        self.task = task
        self.prior = resolve_prior(prior)
        self.input_shape = tuple(input_shape) if input_shape is not None else None
        if isinstance(noise, str):
            if noise not in ("learned", "heteroscedastic"):
                raise ValueError(
                    f"noise must be a positive float, 'learned' or 'heteroscedastic', got {noise!r}"
                )
            self.noise_mode = noise
            self.register_buffer("noise_prior_scale", torch.tensor(float(noise_prior_scale)))
        else:
            if not noise > 0:
                raise ValueError(f"noise must be positive, got {noise}")
            self.noise_mode = "fixed"
            self.register_buffer("noise", torch.tensor(float(noise)))
        self.site_shapes = {name: p.shape for name, p in net.named_parameters()}
        if not self.site_shapes:
            raise ValueError("the network has no parameters to place a prior on")
        self._fan_in = {name: fan_in(name, self.site_shapes) for name in self.site_shapes}

    # ---- the Pyro program ----
    def sample_parameters(self) -> dict[str, torch.Tensor]:
        """``pyro.sample`` every weight (and the noise scale when it is learned)."""
        params = {
            name: pyro.sample(name, self.prior.distribution(shape, self._fan_in[name]))
            for name, shape in self.site_shapes.items()
        }
        if self.task == "regression" and self.noise_mode == "learned":
            params["noise"] = pyro.sample("noise", dist.HalfNormal(self.noise_prior_scale))
        return params

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        params = self.sample_parameters()
        out = self.network(x, params)
        with pyro.plate("data", x.shape[0], dim=-1):
            pyro.sample("obs", self.likelihood(out, params), obs=y)
        return out

    # ---- batched evaluation ----
    def network(self, x: torch.Tensor, params: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Network output for weights ``params``; leading sample dims ``(*S, B, ...)``.

        ``params[name]`` has shape ``(*S, *site_shape)`` with the same ``S`` for every site
        (``S`` may be empty). ``x`` is ``(B, ...)`` and is shared by all samples.
        """
        weights = {name: params[name] for name in self.site_shapes}
        first = next(iter(self.site_shapes))
        lead = weights[first].shape[: weights[first].dim() - len(self.site_shapes[first])]
        if not lead:
            return functional_call(self.net, weights, (x,))
        num = math.prod(lead)
        flat = {name: w.reshape((num,) + self.site_shapes[name]) for name, w in weights.items()}
        out = vmap(lambda p: functional_call(self.net, p, (x,)))(flat)
        return out.reshape(lead + out.shape[1:])

    def likelihood(
        self, out: torch.Tensor, params: Mapping[str, torch.Tensor]
    ) -> dist.TorchDistribution:
        """The observation distribution given network output ``out`` (batch ``(*S, B)``)."""
        if self.task == "classification":
            return dist.Categorical(logits=out)
        if self.noise_mode == "heteroscedastic":
            half = out.shape[-1] // 2
            loc, scale = out[..., :half], F.softplus(out[..., half:]) + 1e-6
        else:
            loc = out
            scale = params["noise"] if self.noise_mode == "learned" else self.noise
            scale = scale.reshape(scale.shape + (1, 1))
        if loc.shape[-1] == 1:
            return dist.Normal(loc.squeeze(-1), scale.squeeze(-1))
        return dist.Normal(loc, scale).to_event(1)

    @property
    def out_features(self) -> int | None:
        """Number of network outputs (classes for classification), when it can be read."""
        last = [shape for name, shape in self.site_shapes.items() if name.endswith("weight")][-1]
        return int(last[0])

    def extra_repr(self) -> str:
        return f"task={self.task!r}, sites={len(self.site_shapes)}, noise={self.noise_mode!r}"
