"""Where a fit of a converted network starts: at its trained weights, or fresh.

A trained network and one just built need opposite starts: the trained start (the module's
weights as every family's means, scales at a hundredth of them, a fine-tune's rate:
:mod:`zoo.training.recipes`) keeps what a trained network knew, and on a network just built it
fine-tunes random weights at a thirtieth of the rate; a fresh start (the guide's own
initialisation and the measured rate) forgets a trained network. So ``zoo.fit`` knows which:

- ``zoo.models.from_module(net, init="module")`` or ``init="fresh"`` says it, and the fit
  takes it as given;
- ``init="auto"`` (``from_module``'s default) is decided before the first step by a look at
  the network as it is: its mean loss on :data:`PROBE_EXAMPLES` training examples (a seeded
  sample of their own; no generator moves), in evaluation mode, against the best constant
  prediction of the same examples (the labels' frequencies for a classifier, the targets'
  mean for regression; :meth:`zoo.models.likelihoods.Likelihood.point_losses`). A network
  whose loss is below :data:`TRAINED_BELOW` times the constant's (per task) has learned
  something from these data and starts trained; any other starts fresh. A fit that inferred
  it warns (:class:`StartWarning`) saying what it read and how to say it.

``result.options["start"]`` is ``"trained"`` or ``"fresh"`` and ``result.options["start_rule"]``
why (``"given (init='module')"``, or the measurement). A network the look cannot judge (a
likelihood of the user's without :meth:`~zoo.models.likelihoods.Likelihood.point_losses`, or
data the probe cannot run) keeps its weights, as a trained one, and says so in the warning.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from zoo.data.sample import sample_examples
from zoo.models.base import BayesianModel
from zoo.models.statistics import frozen_statistics

__all__ = [
    "PROBE_EXAMPLES",
    "TRAINED_BELOW",
    "Start",
    "StartWarning",
    "record",
    "resolve_start",
    "warn_inferred",
]

#: The training examples the look at an ``init="auto"`` network reads.
PROBE_EXAMPLES = 256
#: A network whose loss on them is below this fraction of the best constant prediction's is
#: trained, per task. A classifier just built predicts no better than a constant (its
#: cross-entropy is about ``log C`` or more, at or above the labels' entropy); one trained on
#: the data, even for one epoch, is far below it. A regression network just built can explain
#: part of the targets' variance by chance (a random linear layer on linear targets, say), so
#: regression asks for half the variance explained: misread, a trained network that explains
#: less is refitted from a fresh start, which costs it little, where a fresh one taken for
#: trained is fine-tuned and learns little.
TRAINED_BELOW = {"classification": 0.9, "regression": 0.5}
_CHUNK = 64  # examples per forward pass of the look: bounded memory on large inputs


class StartWarning(UserWarning):
    """``zoo.fit`` inferred whether a converted network is trained (``init="auto"``)."""


@dataclass(frozen=True)
class Start:
    """Where a fit starts: ``init`` is ``"module"`` (the trained start) or ``"fresh"``;
    ``rule`` says why."""

    init: str
    rule: str

    @property
    def label(self) -> str:
        """``"trained"`` or ``"fresh"`` (``result.options["start"]``)."""
        return "trained" if self.init == "module" else "fresh"


def resolve_start(model, data) -> Start | None:
    """The start of a fit of ``model`` on ``data``: ``None`` for a model that does not offer
    its weights (not a :class:`~zoo.models.BayesianModel`); ``model.init`` when it is given;
    the look of the module docstring for ``init="auto"``, recorded on the model
    (``model.inferred_init``, read by :meth:`~zoo.models.BayesianModel.initial_means`); the
    fit warns of it with :func:`warn_inferred`."""
    if not isinstance(model, BayesianModel):
        return None
    if model.init != "auto":
        return Start(model.init, f"given (init={model.init!r})")
    start = _look(model, data)
    model.inferred_init = start.init
    return start


def warn_inferred(start: Start | None) -> None:
    """Warn (:class:`StartWarning`) that ``start`` was inferred, saying how to state it; called
    once the data have passed the fit's checks, so that bad data get their error alone."""
    if start is None or not start.rule.startswith("inferred"):
        return
    warnings.warn(
        f"zoo.fit took this network for a {start.label} one ({start.rule}) and starts it "
        f"{'at its weights, as a fine-tune' if start.init == 'module' else 'fresh'}; say which "
        f"with zoo.models.from_module(net, init='module') for a trained network or "
        f"init='fresh' for one to train from scratch (this also silences the warning)",
        StartWarning,
        stacklevel=6,  # zoo.fit's caller: through fit_process, fit and its two decorators
    )


def _look(model: BayesianModel, data) -> Start:
    """The measured start of an ``init="auto"`` network (see the module docstring)."""
    try:
        x, y = sample_examples(data, PROBE_EXAMPLES)
        device = next(iter(model.net_means(copy=False).values())).device
        x, y = x.to(device), y.to(device)
        losses = model.likelihood.point_losses(_outputs(model, x), y)
    except Exception as err:  # noqa: BLE001 - bad data are refused by the fit's own checks
        return Start("module", f"inferred: the network could not be run on the data ({err})")
    if losses is None:
        return Start(
            "module", f"inferred: {type(model.likelihood).__name__} cannot score one network"
        )
    network, constant = losses
    below = TRAINED_BELOW.get(model.likelihood.task, TRAINED_BELOW["classification"])
    trained = network < below * constant
    return Start(
        "module" if trained else "fresh",
        f"inferred: its loss {network:.4g} on {len(x)} training examples is "
        f"{'below' if trained else 'not below'} {below} x {constant:.4g}, the best "
        "constant prediction's",
    )


def _outputs(model: BayesianModel, x: torch.Tensor) -> torch.Tensor:
    """The network's output on ``x`` at its own weights, in evaluation mode (its running
    statistics read, never updated); the model's mode is put back."""
    was = model.training
    model.train(False)
    try:
        with torch.no_grad(), frozen_statistics():
            weights = model.net_means(copy=False)
            return torch.cat([model.network(part, weights) for part in x.split(_CHUNK)])
    finally:
        model.train(was)


def record(start: Start | None, trained: bool) -> dict[str, str]:
    """``result.options``' ``start`` (``"trained"`` when the fit starts at given weights,
    ``"fresh"`` otherwise) and ``start_rule`` (why), from the model's :class:`Start` and
    whether the family takes the weights (:func:`zoo.training.recipes.starts_trained`)."""
    label = "trained" if trained else "fresh"
    if start is None:
        rule = "the guide's init_module" if trained else "the guide's own initialisation"
    elif (start.init == "module") == trained:
        rule = start.rule
    elif trained:
        rule = f"the guide's init_module (the network: {start.rule})"
    else:
        rule = f"the family draws its own start (the network: {start.rule})"
    return {"start": label, "start_rule": rule}
