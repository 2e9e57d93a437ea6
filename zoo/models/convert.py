"""Turn a plain ``nn.Module`` into a Bayesian Pyro model.

Which parameters are sample sites
---------------------------------
By default every parameter is a sample site, except the affine parameters (``weight``,
``bias``) of normalisation layers (:data:`NORM_LAYERS`: batch, layer, group, instance and RMS
norm), which are *deterministic*: point estimates fitted with the ELBO, as TyXe and
bayesian-torch treat them. So the weights and biases of linear, convolutional, embedding,
attention (``in_proj_weight``, ``out_proj.*``) and recurrent (``weight_ih_l0``, ...) layers, and
any parameter of a user's own module (a class token, a positional embedding), are Bayesian.

``bayesian=`` (patterns) makes exactly the matching parameters sites and every other one
deterministic; ``deterministic=`` (patterns) takes the matching ones out of the sites. Patterns
are :func:`fnmatch.fnmatchcase` patterns over parameter names (``"fc.*"``, ``"layer4.*"``,
``"*.bn*.weight"``); each must match at least one parameter. A deterministic parameter keeps its
``requires_grad``: set it to ``False`` on the module first to keep it fixed (a trained body
under a Bayesian last layer).

What the copy changes
---------------------
The module is deep-copied, never modified. Every stochastic layer of the copy is removed, by
one rule: the layers of :data:`STOCHASTIC_LAYERS` (PyTorch's dropout classes, torchvision's
``StochasticDepth``, timm's ``DropPath`` and ``DropBlock2d``, matched by class name) become
``nn.Identity``, and attention's own dropout is set to 0. The posterior carries the uncertainty
(MC dropout is the ``"mc_dropout"`` family), and random operations inside ``torch.func.vmap``
over the draws would draw one mask for all of them. Randomness written inside a ``forward``
(``F.dropout(x, training=self.training)``) cannot be seen: it follows the model's mode. The copy
is put in training mode; ``zoo.fit`` trains in it and predictions run in evaluation mode
(:mod:`zoo.models.statistics`), except a frozen body's normalisation layers, which stay in
evaluation mode (:mod:`zoo.models.semantics`).

A trained network
-----------------
``init="module"`` makes the module's weights every family's initial posterior means: a
trained network starts the fit where it is. ``init="fresh"`` starts from new draws, as a
network just built must (a fine-tune of random weights learns little). The default,
``init="auto"``, lets ``zoo.fit`` decide before the first step from the network's loss on a
sample of the training data against the best constant prediction, and warn that it did
(:mod:`zoo.training.start`); ``result.options["start"]`` says which start ran and why.
The default prior is ``N(0, 2 / fan_in)`` per layer
(:class:`~zoo.priors.LayerwiseNormalPrior` with :data:`~zoo.priors.HE_GAIN`), He et al.'s
variance-preserving scale, whose prior predictive is far from certain on noise, where
``N(0, 1)`` on every weight of a deep net is near-certain (``benchmarks/trained_network.py prior``);
:class:`~zoo.priors.CentredNormalPrior` centres a prior on the trained weights (empirical
Bayes). A frozen body (``requires_grad=False``) keeps its batch-norm statistics, and an
embedding's ``padding_idx`` row stays zero and is not a site (:mod:`zoo.models.semantics`).
"""

from __future__ import annotations

import copy
import fnmatch
import inspect
from collections.abc import Callable, Iterable
from typing import Any, Literal, overload

from torch import nn

from zoo.models.base import BayesianModel
from zoo.models.checks import check_memory
from zoo.models.likelihoods import Likelihood, from_task
from zoo.models.predictions import ClassificationPrediction, Prediction, RegressionPrediction
from zoo.priors import HE_GAIN, LayerwiseNormalPrior, Prior
from zoo.runtime.torch_private import DROPOUT_LAYERS
from zoo.runtime.torch_private import NORM_LAYERS as RUNNING_NORMS

#: Class names of the stochastic layers that a converted copy replaces by ``nn.Identity``
#: (besides every subclass of PyTorch's dropout base): torchvision's stochastic depth, timm's
#: drop-path and drop-block.
STOCHASTIC_LAYERS = ("StochasticDepth", "DropPath", "DropBlock2d")

#: Layers whose affine parameters are deterministic by default.
NORM_LAYERS = tuple(
    cls
    for cls in (
        *RUNNING_NORMS,  # BatchNorm*d, SyncBatchNorm, InstanceNorm*d
        nn.LayerNorm,
        nn.GroupNorm,
        getattr(nn, "RMSNorm", None),
    )
    if cls is not None
)


# The task in the type (zoo.models.BayesianMLP does the same): a classifier by default.
@overload
def from_module(
    module: nn.Module,
    task: Literal["classification"] = ...,
    prior: Prior | float | str | None = ...,
    noise: float | str = ...,
    input_shape: tuple[int, ...] | None = ...,
    likelihood: Likelihood | None = ...,
    *,
    bayesian: Iterable[str] | None = ...,
    deterministic: Iterable[str] = ...,
    init: str = ...,
    output: int | str | Callable | None = ...,
) -> BayesianModel[ClassificationPrediction]: ...
@overload
def from_module(
    module: nn.Module,
    task: Literal["regression"],
    prior: Prior | float | str | None = ...,
    noise: float | str = ...,
    input_shape: tuple[int, ...] | None = ...,
    likelihood: Likelihood | None = ...,
    *,
    bayesian: Iterable[str] | None = ...,
    deterministic: Iterable[str] = ...,
    init: str = ...,
    output: int | str | Callable | None = ...,
) -> BayesianModel[RegressionPrediction]: ...
@overload
def from_module(
    module: nn.Module,
    task: str,
    prior: Prior | float | str | None = ...,
    noise: float | str = ...,
    input_shape: tuple[int, ...] | None = ...,
    likelihood: Likelihood | None = ...,
    *,
    bayesian: Iterable[str] | None = ...,
    deterministic: Iterable[str] = ...,
    init: str = ...,
    output: int | str | Callable | None = ...,
) -> BayesianModel[Prediction]: ...


def from_module(
    module: nn.Module,
    task: str = "classification",
    prior: Prior | float | str | None = None,
    noise: float | str = "learned",
    input_shape: tuple[int, ...] | None = None,
    likelihood: Likelihood | None = None,
    *,
    bayesian: Iterable[str] | None = None,
    deterministic: Iterable[str] = (),
    init: str = "auto",
    output: int | str | Callable | None = None,
) -> BayesianModel[Any]:
    """A :class:`BayesianModel` with a sample site over the parameters of ``module``.

    Any ``nn.Module`` converts, trained or not: ResNets with batch norm, transformers,
    embeddings, recurrent nets. The module docstring (:mod:`zoo.models.convert`) states which
    parameters are sites, what the copy changes and what a trained network keeps. A trained
    network made Bayesian starts where it is, and a network just built is trained from
    scratch::

        model = zoo.models.from_module(my_trained_net, init="module")
        fit = zoo.fit(model, "diagonal", data)  # the means start at my_trained_net's weights
        fresh = zoo.models.from_module(MyNet(), init="fresh")  # trained as the zoo's own nets

    Left at ``init="auto"``, ``zoo.fit`` tells the two apart from the network's loss on the
    data and warns which it took.

    A Bayesian last layer on a trained, fixed body (its batch norm keeps its statistics)::

        model = zoo.models.from_module(my_net.requires_grad_(False), bayesian=["fc.*"])

    Parameters
    ----------
    module : nn.Module
        The network; site names are its parameter names (``features.0.weight``, ...).
    task, noise, input_shape, likelihood
        See :class:`BayesianModel` (``likelihood`` replaces ``task`` and ``noise``). ``noise``
        defaults to ``"learned"`` (a latent standard deviation; standardise the targets).
    prior : Prior, float or str, optional
        As :class:`BayesianModel` takes it; default ``LayerwiseNormalPrior(HE_GAIN)``,
        ``N(0, 2 / fan_in)`` per layer, for every task.
    bayesian : iterable of str, optional
        Name patterns of the parameters that are sample sites; every other parameter is
        deterministic. Default: every parameter outside a normalisation layer.
    deterministic : iterable of str, optional
        Name patterns of parameters that are deterministic although ``bayesian`` (or the
        default) would make them sites.
    init : {"auto", "module", "fresh"}, default "auto"
        ``"module"``: a trained network; every family's initial means are ``module``'s weights
        and the fit is a fine-tune (a guide's own ``init_module=`` or ``init_loc_fn="kaiming"``
        still wins); ``"fresh"``: a network to train from scratch, its means drawn anew as for
        the zoo's own networks; ``"auto"``: ``zoo.fit`` decides from the network's loss on a
        sample of the training data against the best constant prediction, and warns
        (:class:`zoo.training.start.StartWarning`) which start it took.
    output : int, str or callable, optional
        For a network that returns a tuple, list or dict: the index or key of the output the
        likelihood reads (``output=0`` for a bare ``nn.LSTM``), or a function of the whole
        output. The output must be ``(B, C)`` logits for classification and ``(B,)`` or
        ``(B, D)`` for regression: checked on the first call.

    Raises
    ------
    TypeError
        ``module`` is not an ``nn.Module``, a pattern list is a single string, or ``output``
        is not an index, a key or a callable.
    ValueError
        A pattern matches no parameter, no parameter is left to be a site, ``init`` is not
        one of its values, or ``input_shape`` has a size below 1.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"from_module needs an nn.Module, got {type(module).__name__}")
    if output is not None and not (isinstance(output, (int, str)) or callable(output)):
        raise TypeError(
            f"output must be an index, a key or a function of the network's output, got "
            f"{type(output).__name__}"
        )
    if input_shape is not None:
        _check_input_shape(input_shape)
    _check_forward(module)
    fixed = deterministic_parameters(module, bayesian, deterministic)
    _check_memory(module, fixed)
    net = copy.deepcopy(module)
    _drop_stochastic_layers(net)
    if output is not None:
        net.register_forward_hook(OutputSelector(output))
    net.train()
    if likelihood is None:
        likelihood = from_task(task, noise)
    if prior is None:
        prior = LayerwiseNormalPrior(HE_GAIN)
    return BayesianModel(
        net,
        likelihood=likelihood,
        prior=prior,
        input_shape=input_shape,
        deterministic=fixed,
        init=init,
    )


class OutputSelector:
    """A forward hook that returns one part of a network's output: ``out[index]`` (an index
    or a key), or ``select(out)`` for a callable."""

    def __init__(self, select: int | str | Callable):
        self.select = select

    def __call__(self, module: nn.Module, inputs, out):
        if callable(self.select):
            return self.select(out)
        try:
            return out[self.select]
        except (IndexError, KeyError, TypeError) as err:
            raise ValueError(
                f"output={self.select!r} does not select from {type(module).__name__}'s "
                f"output, a {type(out).__name__} ({err})"
            ) from None


def _check_forward(module: nn.Module) -> None:
    """Refuse a ``forward`` that cannot be called with one input (the model calls
    ``net(x)``): one that needs more, or takes none."""
    try:
        signature = inspect.signature(module.forward)
    except (TypeError, ValueError):
        return
    params = list(signature.parameters.values())
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return
    required = [p.name for p in params if p.default is p.empty and p.kind is not p.VAR_KEYWORD]
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(required) > 1 or not positional:
        shown = ", ".join(p.name for p in params)
        raise TypeError(
            f"{type(module).__name__}.forward takes ({shown}), but the Bayesian model calls it "
            "with one input, net(x): give the other arguments defaults, or wrap the network in "
            "a module whose forward takes x alone (a mask or lengths can travel inside x)"
        )


def _check_memory(module: nn.Module, fixed: list[str]) -> None:
    """Refuse a network whose sites' posterior cannot fit in this machine's memory, with the
    GiB it needs (:func:`zoo.models.checks.check_memory`)."""
    count = sum(p.numel() for n, p in module.named_parameters() if n not in fixed)
    check_memory(
        count,
        f"{type(module).__name__} has, in sample sites,",
        "make fewer parameters sites (bayesian=[...], a Bayesian last layer) or use a larger "
        "machine",
    )


def _check_input_shape(shape) -> None:
    if not isinstance(shape, (tuple, list)) or not all(
        isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in shape
    ):
        raise ValueError(
            f"input_shape must be a tuple of sizes of at least 1 (one example's shape, without "
            f"the batch), got {shape!r}"
        )


def deterministic_parameters(
    module: nn.Module, bayesian: Iterable[str] | None, deterministic: Iterable[str]
) -> list[str]:
    """The names of ``module``'s parameters that are not sample sites under the rules of
    :func:`from_module` (patterns checked: each must match a parameter)."""
    names = [name for name, _ in module.named_parameters()]
    if not names:
        raise ValueError(f"{type(module).__name__} has no parameters to place a prior on")
    if bayesian is None:
        sites = {n for n in names if not _in_norm_layer(module, n)}
    else:
        sites = set(_matching(names, bayesian, "bayesian"))
    sites -= set(_matching(names, deterministic, "deterministic"))
    if not sites:
        raise ValueError(
            f"no parameter of {type(module).__name__} is left to be a sample site (bayesian="
            f"{_listed(bayesian)}, deterministic={_listed(deterministic)}); its parameters are "
            f"{names[:8]}{' ...' if len(names) > 8 else ''}"
        )
    return [n for n in names if n not in sites]


def _matching(names: list[str], patterns, label: str) -> list[str]:
    if isinstance(patterns, str) or not isinstance(patterns, Iterable):
        raise TypeError(
            f"{label} must be a list of name patterns, got {patterns!r}; write [{patterns!r}]"
            if isinstance(patterns, str)
            else f"{label} must be a list of name patterns, got {type(patterns).__name__}"
        )
    found = []
    for pattern in patterns:
        if not isinstance(pattern, str):
            raise TypeError(f"{label} patterns are strings, got {pattern!r}")
        hits = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
        if not hits:
            raise ValueError(
                f"{label} pattern {pattern!r} matches no parameter; the parameters are named "
                f"like {names[:6]} (fnmatch patterns: 'fc.*', 'layer4.*', '*.bias')"
            )
        found += hits
    return found


def _listed(patterns) -> str:
    return "default" if patterns is None else repr(list(patterns))


def _in_norm_layer(module: nn.Module, name: str) -> bool:
    owner = name.rpartition(".")[0]
    return isinstance(module.get_submodule(owner), NORM_LAYERS)


def is_stochastic(layer: nn.Module) -> bool:
    """Whether ``layer`` is a stochastic layer that conversion removes (the rule of the module
    docstring)."""
    return isinstance(layer, DROPOUT_LAYERS) or any(
        cls.__name__ in STOCHASTIC_LAYERS for cls in type(layer).__mro__
    )


def _drop_stochastic_layers(net: nn.Module) -> None:
    """Stochastic layers of ``net`` replaced by ``nn.Identity``, attention's dropout set to 0."""
    for name, sub in list(net.named_modules()):
        if is_stochastic(sub) and name:
            parent, _, leaf = name.rpartition(".")
            setattr(net.get_submodule(parent), leaf, nn.Identity())
        elif isinstance(sub, nn.MultiheadAttention):
            sub.dropout = 0.0
