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

import contextlib
import math
from collections.abc import Iterable, Mapping
from typing import Generic

import pyro
import torch
from torch import nn
from torch.func import functional_call, vmap

from zoo.models import per_draw, semantics, statistics
from zoo.models.likelihoods import Likelihood, from_task
from zoo.models.predictions import PredictionT
from zoo.priors import Prior, resolve_prior
from zoo.runtime.rng import warn_if_seeded_elsewhere


class BayesianModel(nn.Module, Generic[PredictionT]):
    """Pyro model with a sample site over every weight and bias of ``net``.

    ``BayesianModel[ClassificationPrediction]`` or ``[RegressionPrediction]`` for a type
    checker: what a posterior over it predicts (the zoo's classifiers are the first; a
    ``BayesianMLP`` is the task it is given).

    Parameters
    ----------
    net : nn.Module
        The architecture. Its own parameter values are never used by the model (they are
        frozen); a guide may use them as initial means (``init_module=model.net``).
    likelihood : zoo.models.likelihoods.Likelihood, optional
        How the output explains ``y``: :class:`~zoo.models.likelihoods.Categorical` (class indices),
        :class:`~zoo.models.likelihoods.Gaussian` (fixed or learned noise) or
        :class:`~zoo.models.likelihoods.HeteroscedasticGaussian` (``net`` outputs ``2 D`` values).
    task : {"classification", "regression"}, optional
        Shortcut for ``likelihood`` (:func:`zoo.models.likelihoods.from_task`): ``"classification"``
        (the default) is ``Categorical()``; ``"regression"`` is ``Gaussian(noise)``, or
        ``HeteroscedasticGaussian()`` with ``noise="heteroscedastic"``.
    prior : Prior or float, optional
        Weight prior: a :class:`~zoo.priors.Prior`, a number (a Normal prior's standard
        deviation), ``"learned"`` or ``"hierarchical"`` (a scale per layer fitted to the data,
        :mod:`zoo.priors.fitted`). Default :func:`zoo.priors.default_prior` of the task:
        ``NormalPrior(1.0)`` for classification, ``LayerwiseNormalPrior(REGRESSION_GAIN)``
        (``N(0, gain^2 / fan_in)``) for regression.
    noise : float or {"learned", "heteroscedastic"}, default "learned"
        With ``task="regression"``: ``"learned"`` (a latent site ``noise``, a standard
        deviation with a ``HalfNormal(noise_prior_scale)`` prior; standardise the targets so
        that this prior fits them), a fixed observation noise standard deviation (units of
        ``y``) when it is known, or ``"heteroscedastic"``.
    input_shape : tuple, optional
        Shape of one input, used in error messages and checks.
    deterministic : iterable of str, optional
        Names of ``net``'s parameters that are *not* sample sites: point estimates fitted with
        the ELBO (under a flat prior), as a learned prior's scales are. They keep
        their values and their ``requires_grad`` (set it to ``False`` to keep one fixed, a
        trained body under a Bayesian last layer, say). Every other parameter is a site.
    init : {"fresh", "module", "auto"}, default "fresh"
        A guide's initial means when not told (:meth:`initial_means`): ``"module"``, ``net``'s
        own weights (a trained network's); ``"fresh"``, drawn anew by the guide (PyTorch's
        layer initialisation); ``"auto"``, either, as ``zoo.fit`` finds (:mod:`zoo.training.start`).

    Notes
    -----
    Buffers of ``net`` are the model's state: batch norm's running statistics follow PyTorch's
    training and evaluation modes, per weight draw (:mod:`zoo.models.statistics`), and are saved
    and resumed with a fit. Inputs are floating-point, or integer token indices for a network
    that holds an ``nn.Embedding`` or ``nn.EmbeddingBag`` (:attr:`takes_tokens`).
    Networks with PyTorch's fused recurrent layers (``nn.LSTM``, ``nn.GRU``, ``nn.RNN``, which
    ``torch.func.vmap`` cannot batch) run their draws one after another, and so does a network
    whose ``forward`` reads a value of a tensor (``.item()``, a branch on a weight) from the
    first time ``vmap`` refuses it.

    What the network means is kept (:mod:`zoo.models.semantics`): a normalisation layer whose
    parameters are all deterministic and not trainable (a frozen, trained body) stays in
    evaluation mode, so its running statistics are read, never overwritten by a fit; the
    ``padding_idx`` row of an ``nn.Embedding`` or ``nn.EmbeddingBag`` is fixed at zero and is
    not part of the site (``site_shapes`` has one row fewer; :meth:`to_site` and
    :meth:`to_parameter` convert). The network's output is checked against the likelihood on
    its first call (:meth:`check_output`): ``(B, C)`` logits for classification, ``(B,)`` or
    ``(B, D)`` for regression.
    """

    inferred_init: str | None = None  # "module" or "fresh": zoo.fit's look at init="auto"

    def __init__(
        self,
        net: nn.Module,
        *,
        likelihood: Likelihood | None = None,
        task: str | None = None,
        prior: Prior | float | str | None = None,
        noise: float | str = "learned",
        noise_prior_scale: float = 1.0,
        input_shape: tuple[int, ...] | None = None,
        deterministic: Iterable[str] = (),
        init: str = "fresh",
    ):
        warn_if_seeded_elsewhere("building a zoo model")  # its layers drew from that stream
        super().__init__()
        if likelihood is None:
            likelihood = from_task(task or "classification", noise, noise_prior_scale)
        elif not isinstance(likelihood, Likelihood):
            raise TypeError(
                "likelihood must be a zoo.models.likelihoods.Likelihood, got "
                f"{type(likelihood).__name__}"
            )
        elif task is not None and task != likelihood.task:
            raise ValueError(
                f"task={task!r} contradicts the {type(likelihood).__name__} likelihood"
            )
        self.net = net
        names = dict(net.named_parameters())
        fixed = tuple(deterministic)
        unknown = sorted(set(fixed) - set(names))
        if unknown:
            raise ValueError(f"deterministic names parameters the network lacks: {unknown}")
        self.deterministic = tuple(n for n in names if n in fixed)
        if init not in ("fresh", "module", "auto"):
            raise ValueError(f"init must be 'module', 'fresh' or 'auto', got {init!r}")
        self.init = init
        for name, p in names.items():
            if name not in fixed:
                p.requires_grad_(False)
        self.likelihood = likelihood
        self.prior = resolve_prior(prior, likelihood.task)
        self.input_shape = tuple(input_shape) if input_shape is not None else None
        self._padding = semantics.padding_rows(net, set(names) - set(fixed))
        self.site_shapes = {
            name: semantics.site_shape(p.shape, self._padding.get(name))
            for name, p in names.items()
            if name not in fixed
        }
        if not self.site_shapes:
            raise ValueError(
                "the network has no parameters to place a prior on"
                + (" (every one is deterministic)" if names else "")
            )
        self._read_network()
        # training inputs each draw's batch norm statistics are estimated on (a fit's, at its
        # end; zoo.models.per_draw); not in the state dict: a fit saves it itself
        self.register_buffer("statistics_inputs", None, persistent=False)
        self._fan_in = semantics.fan_ins(self.net, self.site_shapes)
        self.prior.bind(self.site_shapes, self._fan_in)

    def __setstate__(self, state):
        if "likelihood" not in state.get("_modules", {}):  # pickled before likelihood objects
            _likelihood_from_v1(state)
        state.setdefault("deterministic", ())
        state.setdefault("init", "fresh")
        state.setdefault("_padding", {})
        super().__setstate__(state)
        if "_statistics" not in self.__dict__:  # pickled before running statistics
            self._read_network()
        if "statistics_inputs" not in self._buffers:  # pickled before per-draw statistics
            self.register_buffer("statistics_inputs", None, persistent=False)

    def _read_network(self) -> None:
        """What the forward pass needs to know of the network: the names of its running
        statistics, and whether ``vmap`` can batch it (no fused recurrent layer)."""
        self._statistics = statistics.running_buffers(self.net)
        self._fixed_norms = semantics.fixed_norm_layers(self.net, self.deterministic)
        for layer in self._fixed_norms:
            self.net.get_submodule(layer).train(False)
        self._out_features: int | None = None
        self._vectorised = not any(isinstance(m, nn.RNNBase) for m in self.net.modules())

    @property
    def takes_tokens(self) -> bool:
        """Whether the network may take integer token indices as inputs (it holds an
        ``nn.Embedding`` or ``nn.EmbeddingBag``); other networks take floating-point inputs."""
        return any(isinstance(m, (nn.Embedding, nn.EmbeddingBag)) for m in self.net.modules())

    def train(self, mode: bool = True) -> BayesianModel:
        """PyTorch's ``train``, except that the fixed normalisation layers of a frozen body
        (see the class notes) stay in evaluation mode."""
        super().train(mode)
        for layer in self._fixed_norms:
            self.net.get_submodule(layer).train(False)
        return self

    # ---- sites and the network's parameters ----
    def to_site(self, name: str, value: torch.Tensor) -> torch.Tensor:
        """``value``, shaped like the network's parameter ``name`` (leading dims allowed), as
        the site holds it: without a ``padding_idx`` row."""
        row = self._padding.get(name)
        return value if row is None else semantics.without_row(value, row)

    def to_parameter(self, name: str, value: torch.Tensor) -> torch.Tensor:
        """A site's ``value`` as the network's parameter ``name``: the zero ``padding_idx``
        row put back (the inverse of :meth:`to_site`)."""
        row = self._padding.get(name)
        return value if row is None else semantics.with_zero_row(value, row)

    def net_means(self, copy: bool = True) -> dict[str, torch.Tensor]:
        """The network's own weights at every site, site-shaped: detached copies, or with
        ``copy=False`` detached views of the parameters (no memory; to read, never to write:
        the checks' probes of the network)."""
        params = dict(self.net.named_parameters())
        views = {n: self.to_site(n, params[n].detach()) for n in self.site_shapes}
        return {n: v.clone() for n, v in views.items()} if copy else views

    @property
    def offers_weights(self) -> bool:
        """Whether guides start at the network's weights: ``init`` not given nor inferred fresh."""
        return (self.inferred_init or self.init) != "fresh"

    def initial_means(self) -> dict[str, torch.Tensor] | None:
        """The network's weights (:meth:`net_means`) where it :attr:`offers_weights`, else None."""
        return self.net_means() if self.offers_weights else None

    def check_output(self, out: torch.Tensor) -> None:
        """Refuse a network output that the likelihood cannot read (a tuple, a tensor of the
        wrong rank: ``(B, 1, C)`` would broadcast every example against every label); record
        the output width (the class count for classification)."""
        semantics.check_output(out, self.likelihood.task, type(self.net).__name__)
        self._out_features = int(out.shape[-1]) if out.dim() > 1 else 1

    @property
    def task(self) -> str:
        """The likelihood's label: ``"classification"`` or ``"regression"``."""
        return self.likelihood.task

    def spec(self) -> dict | None:
        """Plain data that rebuilds this model (``zoo.models.build``), for ``zoo``'s own model
        classes; ``None`` for a network of the user's, which ``zoo.load`` needs as ``model=``."""
        return None

    def _class_spec(self, **args) -> dict | None:
        """``spec()`` of a ``zoo.models`` class built from ``args`` and the prior (``None`` when
        the class or the prior is the user's own)."""
        prior = self.prior.spec()
        if prior is None or not type(self).__module__.startswith("zoo.models."):
            return None
        return {"class": type(self).__name__, "args": {**args, "prior": prior}}

    # ---- the Pyro program ----
    def sample_parameters(self) -> dict[str, torch.Tensor]:
        """``pyro.sample`` the prior's own latent sites (a hierarchical scale), every weight,
        then the likelihood's own latent sites (a noise)."""
        prior = self.prior
        params = prior.sample_latent()
        for name, shape in self.site_shapes.items():
            site_prior = prior.site_distribution(name, shape, self._fan_in[name], params)
            params[name] = pyro.sample(name, site_prior)
        params.update(self.likelihood.sample_latent())
        return params

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        params = outer_draws(self.sample_parameters(), self.site_shapes)
        out = self.network(x, params)
        with pyro.plate("data", x.shape[0], dim=-1):
            pyro.sample("obs", self.likelihood.distribution(out, params), obs=y)
        return out

    # ---- batched evaluation ----
    def network(
        self,
        x: torch.Tensor,
        params: Mapping[str, torch.Tensor],
        buffers: Mapping[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Network output for weights ``params``; leading sample dims ``(*S, B, ...)``.

        ``params[name]`` has shape ``(*S, *site_shape)`` with the same ``S`` for every site
        (``S`` may be empty). ``x`` is ``(B, ...)`` and is shared by all samples.
        ``buffers`` (``{buffer: (S, *shape)}``, one leading dim ``S`` or none, from
        :func:`zoo.models.per_draw.draw_statistics`): each draw's own running
        statistics, read in evaluation mode in place of the network's.
        """
        weights = {name: params[name] for name in self.site_shapes}
        first = next(iter(self.site_shapes))
        lead = weights[first].shape[: weights[first].dim() - len(self.site_shapes[first])]
        if buffers is not None:
            drawn = per_draw.network_with(self, x, weights, dict(buffers), tuple(lead))
            return self._shaped(drawn, len(lead))
        if not lead:
            weights = {name: self.to_parameter(name, w) for name, w in weights.items()}
            if torch.jit.is_tracing():  # functional_call refuses to run under torch.jit.trace
                with swapped_parameters(self.net, weights):
                    return self._shaped(self.net(x), 0)
            return self._shaped(statistics.single_call(self.net, weights, x, self._statistics), 0)
        num = math.prod(lead)
        flat = {
            name: self.to_parameter(name, w.reshape((num,) + self.site_shapes[name]))
            for name, w in weights.items()
        }
        names = self._statistics
        out = None
        if self._vectorised:
            try:
                if statistics.updates_statistics(self.net, names):
                    out = statistics.batched_call(self.net, flat, x, num, names)
                else:
                    out = vmap(lambda p: functional_call(self.net, p, (x,)))(flat)
            except RuntimeError as err:  # an operation vmap cannot batch: .item(), a branch
                if "vmap" not in str(err):
                    raise
                self._vectorised = False  # one draw after another from now on
        if out is None:
            out = statistics.looped_call(
                lambda p: statistics.single_call(self.net, p, x, names), flat, num
            )
        out = self._shaped(out, 1)
        return out.reshape(lead + out.shape[1:])

    def _shaped(self, out, lead: int) -> torch.Tensor:
        """The network's output with ``lead`` draw dims: a tensor (else a clear error), a
        regression output ``(..., B)`` read as one output per example ``(..., B, 1)``."""
        if not torch.is_tensor(out):
            semantics.check_output(out, self.likelihood.task, type(self.net).__name__)
        if self.likelihood.task == "regression" and out.dim() == lead + 1:
            return out.unsqueeze(-1)
        return out

    @property
    def out_features(self) -> int | None:
        """Number of network outputs (classes for classification): the width of the output
        of the network's first checked call (:meth:`check_output`), else ``None``."""
        return self._out_features

    def extra_repr(self) -> str:
        return f"sites={len(self.site_shapes)}"


def outer_draws(params: dict, site_shapes: Mapping) -> dict:
    """``params`` drawn in a plate around the model at dim -2 (Pyro's vectorised ELBO
    particles) without the singleton that stands where the data plate lies (dim -1: the
    weights are outside it): a weight of shape ``(P, 1, *site)`` becomes ``(P, *site)``, so the
    network's output is ``(P, B, ...)`` and the likelihood's batch ``(P, B)``, one term per
    particle and example (with the singleton kept it broadcast to ``(P, P, B)`` and counted
    the data ``P`` times). Draws of shape ``(S, *site)`` (Pyro's ``Predictive(parallel=True)``
    conditions the model so) are already in that form."""
    first = next(iter(site_shapes))
    weight = params[first]
    lead = weight.shape[: weight.dim() - len(site_shapes[first])]
    if len(lead) < 2 or lead[-1] != 1:
        return params
    cut = len(lead) - 1
    return {
        name: v.squeeze(cut) if v.dim() > cut and v.shape[: cut + 1] == lead else v
        for name, v in params.items()
    }


@contextlib.contextmanager
def swapped_parameters(net: nn.Module, weights: Mapping[str, torch.Tensor]):
    """``net`` with the tensors ``weights`` in place of its parameters of the same names inside
    the block (its own parameters back afterwards): the route for ``torch.jit.trace`` (Pyro's
    ``JitTrace_ELBO``), under which ``torch.func.functional_call`` refuses to run."""
    canonical = {id(p): n for n, p in net.named_parameters()}  # a tied weight's one name
    owners = []  # (module, leaf, site): every name a site's parameter has, tied ones too
    for alias, p in net.named_parameters(remove_duplicate=False):
        if canonical[id(p)] in weights:
            path, _, leaf = alias.rpartition(".")
            owners.append((net.get_submodule(path), leaf, canonical[id(p)]))
    saved = [module._parameters[leaf] for module, leaf, _ in owners]
    try:
        for module, leaf, name in owners:
            module._parameters[leaf] = weights[name]  # type: ignore[assignment]  # a draw, not a Parameter
        yield net
    finally:
        for (module, leaf, _), value in zip(owners, saved):
            module._parameters[leaf] = value


def _likelihood_from_v1(state: dict) -> None:
    """Give a model pickled by version 1 (``task`` and ``noise_mode`` attributes, noise
    buffers) the likelihood object that means the same."""
    buffers = state.get("_buffers", {})
    task, mode = state.pop("task", "classification"), state.pop("noise_mode", "fixed")
    noise_prior = buffers.pop("noise_prior_scale", None)
    noise = buffers.pop("noise", None)
    if task == "classification":
        likelihood = from_task(task)
    elif mode == "heteroscedastic":
        likelihood = from_task(task, "heteroscedastic")
    elif mode == "learned":
        likelihood = from_task(task, "learned", float(noise_prior))
    else:
        likelihood = from_task(task, float(noise))
    state.setdefault("_modules", {})["likelihood"] = likelihood
