"""Turn a plain ``nn.Module`` into a Bayesian Pyro model."""

from __future__ import annotations

import copy

from torch import nn

from zoo.models.base import BayesianModel
from zoo.models.likelihoods import Likelihood, from_task
from zoo.priors import Prior

SUPPORTED_LAYERS = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


def from_module(
    module: nn.Module,
    task: str = "classification",
    prior: Prior | float | str | None = None,
    noise: float | str = "learned",
    input_shape: tuple[int, ...] | None = None,
    likelihood: Likelihood | None = None,
) -> BayesianModel:
    """A :class:`BayesianModel` with a sample site over every parameter of ``module``.

    ``module`` is copied, not modified. Its layers with parameters must be ``Linear`` or
    ``Conv`` layers; any parameter-free layer (activations, pooling, flatten, reshapes in
    ``forward``) is allowed. Dropout is left to the posterior: call ``module.eval()`` first, or
    leave it out.

    Use ``init_module=module`` in a guide to start the posterior means at ``module``'s weights::

        model = zoo.models.from_module(my_net, task="classification")
        fit = zoo.fit(model, guides.AutoDiagonal(model, init_module=my_net), data)

    Parameters
    ----------
    module : nn.Module
        The network; site names are its parameter names (``features.0.weight``, ...).
    task, prior, noise, input_shape, likelihood
        See :class:`BayesianModel` (``likelihood`` replaces ``task`` and ``noise``). ``noise``
        defaults to ``"learned"`` (a latent standard deviation; standardise the targets).
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"from_module needs an nn.Module, got {type(module).__name__}")
    for name, sub in module.named_modules():
        own = list(sub.parameters(recurse=False))
        if own and not isinstance(sub, SUPPORTED_LAYERS):
            label = name or "the module itself"
            raise TypeError(
                f"{label} ({type(sub).__name__}) has parameters; from_module supports parameters "
                f"only in {[c.__name__ for c in SUPPORTED_LAYERS]} layers. Replace it with a "
                "parameter-free layer or fold it into the neighbouring Linear/Conv layer."
            )
        if sub.training and isinstance(sub, nn.modules.dropout._DropoutNd):
            raise TypeError(
                f"{name} is a Dropout layer in training mode; call module.eval() or remove it"
            )
    net = copy.deepcopy(module)
    if likelihood is None:
        likelihood = from_task(task, noise)
    return BayesianModel(net, likelihood=likelihood, prior=prior, input_shape=input_shape)
