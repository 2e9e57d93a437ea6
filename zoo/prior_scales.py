"""Deprecated: the fitted prior scales moved to :mod:`zoo.priors.fitted` (every name is also in
:mod:`zoo.priors`). This module re-exports them for one release."""

from __future__ import annotations

import warnings

from zoo.priors.fitted import (  # noqa: F401
    PER,
    SITE_PREFIX,
    GroupedScalePrior,
    HierarchicalNormalPrior,
    LearnedNormalPrior,
    scale_groups,
)

warnings.warn(
    "zoo.prior_scales moved to zoo.priors.fitted (its names are also in zoo.priors); this "
    "module will be removed in the next release",
    DeprecationWarning,
    stacklevel=2,
)
