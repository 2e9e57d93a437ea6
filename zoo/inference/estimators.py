"""Gradient estimators of the expected log-likelihood: reparameterisation, local
reparameterisation and Flipout.

``zoo.Loss(estimator=...)`` chooses how the network's layers see the weight posterior
during training. All three are unbiased for the ELBO; they differ in gradient variance and cost.

``"reparam"`` (default)
    One weight draw ``W ~ q`` per step, shared by every example of the minibatch.
``"local"`` (Kingma et al. 2015; Louizos & Welling 2016 for the matrix normal)
    A linear layer samples its pre-activations instead of its weights, independently per
    example, from their exact distribution under ``q``:

    - diagonal ``q``: ``b_n ~ N(M x_n, diag((S^2) (x_n^2)))`` (``S`` standard deviations);
    - matrix normal ``W = M + A E B^T``: ``b_n = M x_n + |B^T x_n| A eps_n``, i.e.
      ``b_n ~ N(M x_n, (x_n^T B B^T x_n) A A^T)``;
    - MC dropout ``W = M diag(z) + sigma E``: ``b_n = M (z_n * x_n) + sigma |x_n| eps_n`` with a
      keep-mask ``z_n`` per example (standard dropout training);
    - point mass: ``b_n = M x_n``.

    Each example's network output then has exactly its distribution under ``q``, so the
    likelihood term is unbiased, with the noise of the examples decorrelated. Exact for linear
    layers applied to one row per example (a ``(B, in)`` input; a linear layer over a
    sequence's positions, ``(B, T, in)``, shares its weight across them and keeps the shared
    draw, under Flipout too): a convolution shares one kernel across positions, so its outputs are
    correlated within an example, and convolutions keep the shared weight draw, except under MC
    dropout, whose convolutions draw a channel mask per example (``x_n * z_n`` convolved with
    ``M``, plus one shared draw of the ``sigma`` blur): each example's output again has exactly
    its distribution under ``q``. With
    ``elbo="meanfield"`` the served weights are not even drawn (the KL is in closed form),
    which is what makes the matrix normal cheap: no ``A E B^T`` per step.
``"auto"``
    ``"local"`` on the layers where the family's distribution prefers it
    (``prefers_local(layer, rows)``), a shared draw everywhere else; with ``num_particles > 1``
    a shared draw everywhere. Two families' default (``guides.Recipe``): the matrix normal's,
    on the linear layers where the local reparameterisation is cheaper than a draw for the
    minibatch (``rows (out^2 + in^2) < out in (out + in)``), with the closed-form KL, so that
    a wide layer never forms ``A E B^T`` (``benchmarks/width.py``); and MC dropout's, on
    every linear and convolution layer: a mask per example, as dropout trains, whose
    gradients are far less noisy than one mask shared by the minibatch
    (``benchmarks/fairness.py`` at ``cc5a66b``).
``"flipout"`` (Wen et al. 2018)
    The shared draw's deviation ``dW = W - M`` is decorrelated across examples by random signs,
    ``b_n = M x_n + r_n * (dW (s_n * x_n))`` with ``r_n, s_n`` uniform in ``{-1, +1}``. Exact
    when ``dW`` and ``dW * (r s^T)`` have the same distribution: the diagonal family, for linear
    and convolutional layers (signs per input and output channel).

Sites and layers outside an estimator's reach keep plain reparameterisation; ``fit`` refuses an
estimator that serves no site of the guide. Both need ``num_particles=1`` (they already draw
independent noise per example).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from pyro import poutine
from pyro.poutine.messenger import Messenger
from torch.overrides import TorchFunctionMode

from guides.gaussian import has_closed_form_kl

ESTIMATORS = ("reparam", "local", "flipout", "auto")
_CONVS = {F.conv1d: 1, F.conv2d: 2, F.conv3d: 3}
_CONV_ARGS = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")


def check_estimator(estimator: str) -> None:
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}")


def serves(estimator: str, fn, layer: str, rows: int = 1) -> bool:
    """Whether ``estimator`` is exact for a weight with posterior ``fn`` in a ``layer``
    (``"linear"`` or ``"conv"``), as the distribution states it (see
    :class:`guides.gaussian.GaussianMixin`); for ``"auto"``, whether ``"local"`` is and the
    distribution prefers it for that layer seeing ``rows`` examples (its
    ``prefers_local(layer, rows)``; a distribution without one never does)."""
    if estimator == "auto":
        prefers = getattr(fn, "prefers_local", None)
        return prefers is not None and bool(prefers(layer, rows)) and serves("local", fn, layer)
    if estimator == "local":
        if layer == "conv":
            return getattr(fn, "supports_local_conv", False)
        return getattr(fn, "supports_local_reparameterization", False)
    if estimator == "flipout":
        return getattr(fn, "supports_flipout", False)
    return False


class RecordGuideSites(Messenger):
    """Records each latent site's guide distribution and value (``sites[name] = (fn, value)``).

    With ``skip_sampling``, those sites take the posterior mean as their value instead of a
    draw: for ``estimator="local"`` with a closed-form KL, where served weights are never used.
    """

    def __init__(self, skip_sampling: frozenset[str] = frozenset()):
        super().__init__()
        self.sites: dict[str, tuple] = {}
        self.skip_sampling = skip_sampling

    def _pyro_sample(self, msg):
        if msg["name"] in self.skip_sampling and msg["value"] is None:
            msg["value"] = msg["fn"].mean_value()  # its log_prob (unused) costs no solve

    def _pyro_post_sample(self, msg):
        if not msg["is_observed"]:
            self.sites[msg["name"]] = (msg["fn"], msg["value"])


class LayerNoise(TorchFunctionMode):
    """While active, linear and convolution calls whose weight is one of the recorded site
    values are evaluated with ``estimator``; ``served`` collects the names of those sites.

    ``"auto"`` decides per site once, at :func:`plan` (``rows``: the minibatch's examples,
    default the call's), and then serves exactly those sites (``only``), whatever the rows of
    a later call: a site whose weight was left undrawn must be served at every call."""

    def __init__(
        self,
        estimator: str,
        sites: dict[str, tuple],
        only: frozenset[str] | None = None,
        rows: int | None = None,
    ):
        super().__init__()
        self.estimator, self.only, self.rows = estimator, only, rows
        self.by_id = {id(value): (name, fn, value) for name, (fn, value) in sites.items()}
        self.served: set[str] = set()

    def _serves(self, name: str, fn, layer: str, examples: int) -> bool:
        if self.estimator == "auto" and self.only is not None:
            return name in self.only
        return serves(self.estimator, fn, layer, self.rows or examples)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear or func in _CONVS:
            arguments = _bind(func, args, kwargs)
            entry = self.by_id.get(id(arguments["weight"]))
            layer = "linear" if func is F.linear else "conv"
            # a linear layer over several rows of one example (a sequence's positions) shares
            # its weight across them: per-row noise would not be one draw per example
            rows = func is not F.linear or arguments["input"].dim() == 2
            examples = arguments["input"].shape[0]
            if entry is not None and rows and self._serves(entry[0], entry[1], layer, examples):
                self.served.add(entry[0])
                if self.estimator in ("local", "auto"):
                    if layer == "conv":
                        return entry[1].local_conv(func, arguments)
                    return entry[1].local_linear(arguments["input"], arguments["bias"])
                return _flipout(func, arguments, entry[1], entry[2])
        return func(*args, **kwargs)


def _bind(func, args, kwargs) -> dict:
    names = ("input", "weight", "bias") if func is F.linear else _CONV_ARGS
    bound = dict(zip(names, args))
    bound.update(kwargs)
    bound.setdefault("bias", None)
    return bound


def _flipout(func, arguments: dict, fn, value: torch.Tensor) -> torch.Tensor:
    x, mean_w = arguments["input"], fn.mean
    delta = value - mean_w
    options = {k: v for k, v in arguments.items() if k not in ("input", "weight", "bias")}
    out = func(x, mean_w, arguments["bias"], **options)
    if func is F.linear:
        s = _signs(x.shape, x)
        r = _signs(out.shape, out)
    else:  # one sign per example and channel, broadcast over positions
        spatial = _CONVS[func]
        s = _signs(x.shape[: x.dim() - spatial] + (1,) * spatial, x)
        r = _signs(out.shape[: out.dim() - spatial] + (1,) * spatial, out)
    return out + func(x * s, delta, None, **options) * r


def _signs(shape, like: torch.Tensor) -> torch.Tensor:
    return torch.randint(0, 2, shape, device=like.device).to(like.dtype).mul_(2).sub_(1)


def wire(
    model: Callable, guide: Callable, estimator: str, *planned: frozenset[str] | None
) -> tuple[Callable, Callable]:
    """The model and guide an ELBO should run for ``estimator``: for ``"reparam"`` the two
    unchanged; otherwise the guide records its sites (see :class:`RecordGuideSites`) and the
    model runs under :class:`LayerNoise` with them. ``planned``: :func:`plan`'s sites whose draw
    is skipped, and for ``"auto"`` the sites it serves. The model callable's ``served``
    attribute holds the sites the last call served."""
    if estimator == "reparam":
        return model, guide
    return _with_estimator(model, guide, estimator, *planned)


def _with_estimator(
    model: Callable, guide: Callable, estimator: str, skip=frozenset(), only=None, rows=None
) -> tuple[_WithEstimator, Callable]:
    record = RecordGuideSites(skip)
    return _WithEstimator(model, estimator, record, only, rows), record(guide)


class _WithEstimator:
    """``model`` run under :class:`LayerNoise` with the recorded guide's sites; ``served``:
    the sites the last call served."""

    def __init__(self, model: Callable, estimator: str, record: RecordGuideSites, only, rows):
        self.model, self.estimator, self.record = model, estimator, record
        self.only, self.rows = only, rows
        self.served: set[str] = set()

    def __call__(self, *args, **kwargs):
        mode = LayerNoise(self.estimator, self.record.sites, self.only, self.rows)
        with mode:
            out = self.model(*args, **kwargs)
        self.served = mode.served
        return out


def plan(
    model: Callable, guide: Callable, estimator: str, elbo: str, *args, rows: int | None = None
) -> tuple:
    """Which latent sites ``estimator`` serves, found by one traced pass without gradients
    (``"auto"`` decides for minibatches of ``rows`` examples, default the pass's).

    Returns ``(served, skip_sampling)``: the served site names, and those whose draw is not
    needed at all (``"local"`` or ``"auto"`` with ``elbo="meanfield"`` and a closed-form KL
    against the model's prior; Flipout always needs the shared draw).
    """

    run, recording_guide = _with_estimator(model, guide, estimator, rows=rows)
    with torch.no_grad():
        guide_trace = poutine.trace(recording_guide).get_trace(*args)
        model_trace = poutine.trace(poutine.replay(run, trace=guide_trace)).get_trace(*args)
    served = frozenset(run.served)
    skip: set[str] = set()
    if elbo == "meanfield" and estimator in ("local", "auto"):
        for name in served:
            if has_closed_form_kl(guide_trace.nodes[name]["fn"], model_trace.nodes[name]["fn"]):
                skip.add(name)
    return served, frozenset(skip)
