"""Weight priors: fixed scales (:mod:`zoo.priors.fixed`: the :class:`Prior` interface,
``N(0, s^2)``, ``N(0, g^2 / fan_in)``, the scale mixture) and scales fitted to the data
(:mod:`zoo.priors.fitted`: type-II maximum likelihood and a hierarchical prior), a prior
centred on given weights (:mod:`zoo.priors.centred`: empirical Bayes around a trained
network), and
:func:`resolve_prior`, which turns what a model's ``prior=`` takes into one of them.

Each prior is an ``nn.Module`` whose numbers are buffers or parameters, so ``model.to(device)``
moves them with the model; ``prior.distribution(shape, fan_in)`` gives a site's distribution,
whose event shape is the whole weight tensor.
"""

from __future__ import annotations

from zoo.arguments import is_number
from zoo.priors.centred import CentredNormalPrior
from zoo.priors.fitted import (
    PER,
    SITE_PREFIX,
    GroupedScalePrior,
    HierarchicalNormalPrior,
    LearnedNormalPrior,
    scale_groups,
)
from zoo.priors.fixed import (
    BUILT_IN,
    HE_GAIN,
    REGRESSION_GAIN,
    IsotropicNormal,
    LayerwiseNormalPrior,
    NormalPrior,
    Prior,
    ScaleMixtureNormal,
    ScaleMixturePrior,
    default_prior,
    from_spec,
)

__all__ = [
    "BUILT_IN",
    "HE_GAIN",
    "NAMED",
    "PER",
    "REGRESSION_GAIN",
    "SITE_PREFIX",
    "CentredNormalPrior",
    "GroupedScalePrior",
    "HierarchicalNormalPrior",
    "IsotropicNormal",
    "LayerwiseNormalPrior",
    "LearnedNormalPrior",
    "NormalPrior",
    "Prior",
    "ScaleMixtureNormal",
    "ScaleMixturePrior",
    "default_prior",
    "from_spec",
    "resolve_prior",
    "scale_groups",
]

#: Priors a model takes by name (``prior="learned"``).
NAMED = {"learned": LearnedNormalPrior, "hierarchical": HierarchicalNormalPrior}


def resolve_prior(prior: Prior | float | str | None, task: str = "classification") -> Prior:
    """The prior a model takes.

    ``None`` -> :func:`default_prior` of ``task``; a number -> ``NormalPrior(number)``;
    ``"learned"`` -> ``LearnedNormalPrior()`` and ``"hierarchical"`` ->
    ``HierarchicalNormalPrior()`` (a scale per layer fitted to the data,
    :mod:`zoo.priors.fitted`); a Prior as is.
    """
    if prior is None:
        return default_prior(task)
    if isinstance(prior, Prior):
        return prior
    if isinstance(prior, str) and prior in NAMED:
        return NAMED[prior]()
    if is_number(prior):
        return NormalPrior(float(prior))
    raise TypeError(
        "prior must be a zoo.priors.Prior, a positive number (a Normal prior's scale) or one of "
        f"{sorted(NAMED)}, got {prior!r}"
    )
