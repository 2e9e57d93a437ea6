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
The module is deep-copied, never modified. Dropout layers of the copy become ``nn.Identity``
and attention's own dropout is set to 0: the posterior carries the uncertainty (MC dropout is
the ``"mc_dropout"`` family), and random operations inside ``torch.func.vmap`` over the draws
would draw one mask for all of them. The copy is put in training mode; ``zoo.fit`` trains in it
and predictions run in evaluation mode (:mod:`zoo.models.statistics`).
"""

from __future__ import annotations

import copy
import fnmatch
from collections.abc import Iterable

from torch import nn

from zoo.models.base import BayesianModel
from zoo.models.likelihoods import Likelihood, from_task
from zoo.priors import Prior

#: Layers whose affine parameters are deterministic by default.
NORM_LAYERS = tuple(
    cls
    for cls in (
        nn.modules.batchnorm._NormBase,  # BatchNorm*d, SyncBatchNorm, InstanceNorm*d
        nn.LayerNorm,
        nn.GroupNorm,
        getattr(nn, "RMSNorm", None),
    )
    if cls is not None
)


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
) -> BayesianModel:
    """A :class:`BayesianModel` with a sample site over the parameters of ``module``.

    Any ``nn.Module`` converts: ResNets with batch norm, transformers, embeddings, recurrent
    nets. The module docstring (:mod:`zoo.models.convert`) states which parameters are sites
    by default and what the copy changes. Use ``init_module=module`` in a guide to start the
    posterior means at ``module``'s weights::

        model = zoo.models.from_module(my_net, task="classification")
        fit = zoo.fit(model, guides.AutoDiagonal(model, init_module=my_net), data)

    A Bayesian last layer on a trained, fixed body is one call::

        body_fixed = my_net.requires_grad_(False)  # the body keeps its trained weights
        model = zoo.models.from_module(my_net, bayesian=["fc.*"])

    Parameters
    ----------
    module : nn.Module
        The network; site names are its parameter names (``features.0.weight``, ...).
    task, prior, noise, input_shape, likelihood
        See :class:`BayesianModel` (``likelihood`` replaces ``task`` and ``noise``). ``noise``
        defaults to ``"learned"`` (a latent standard deviation; standardise the targets).
    bayesian : iterable of str, optional
        Name patterns of the parameters that are sample sites; every other parameter is
        deterministic. Default: every parameter outside a normalisation layer.
    deterministic : iterable of str, optional
        Name patterns of parameters that are deterministic although ``bayesian`` (or the
        default) would make them sites.

    Raises
    ------
    TypeError
        ``module`` is not an ``nn.Module``, or a pattern list is a single string.
    ValueError
        A pattern matches no parameter, or no parameter is left to be a site.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"from_module needs an nn.Module, got {type(module).__name__}")
    fixed = deterministic_parameters(module, bayesian, deterministic)
    net = copy.deepcopy(module)
    _drop_dropout(net)
    net.train()
    if likelihood is None:
        likelihood = from_task(task, noise)
    return BayesianModel(
        net, likelihood=likelihood, prior=prior, input_shape=input_shape, deterministic=fixed
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


def _drop_dropout(net: nn.Module) -> None:
    """Dropout layers of ``net`` replaced by ``nn.Identity``, attention's dropout set to 0."""
    for name, sub in list(net.named_modules()):
        if isinstance(sub, nn.modules.dropout._DropoutNd) and name:
            parent, _, leaf = name.rpartition(".")
            setattr(net.get_submodule(parent), leaf, nn.Identity())
        elif isinstance(sub, nn.MultiheadAttention):
            sub.dropout = 0.0
