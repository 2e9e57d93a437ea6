"""Subnetwork inference (Daxberger et al., ICML 2021): a full-covariance Gaussian over ``S``
chosen weights from anywhere in the network, with their correlations across layers, and point
masses (MAP) on every other weight.

The paper trains a network to a MAP solution, chooses the ``S`` weights of largest marginal
variance under a diagonal Laplace approximation at the MAP, infers a full covariance over
those only, and predicts with the mix of Bayesian and point-estimate weights. Here the joint
Gaussian is :class:`guides.families.joint.AutoJoint`'s, over the chosen scalars of every real
site, and the choice is one of

- the paper's rule: :func:`zoo.subnetwork_guide` (a MAP fit, laplace-torch's diagonal Laplace,
  its largest marginal variances; the guide it returns holds them as masks, means at the MAP);
- ``select={site: mask}``: given scalars (bool tensors shaped like the sites, or flat indices);
- ``select="magnitude"`` (the family's default, a baseline): the ``S`` largest ``|mean|`` at
  the start of the fit (``init_module=`` a trained network: its largest weights);
- :meth:`AutoSubnetwork.from_fit` (baselines): from a fitted guide, the largest marginal
  variances of a fitted VI Gaussian (e.g. the diagonal family's) or the largest ``|mean|``
  of a MAP fit, starting from that fit's means.

Cost: the factor is ``S x S`` (``S(S-1)/2 + S`` free numbers), each step a product with it,
``O(S^2)``; ``S`` above :data:`guides.joint_gaussian.FULL_MAX` is refused when the guide is
built (pass ``rank=`` for a low-rank plus diagonal covariance instead, ``O(S rank^2)``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from guides.checks import InvalidArgument, check_choice, check_int
from guides.families.joint import AutoJoint
from guides.joint_gaussian import check_size, indices

#: ``S`` when ``size`` is not given and the weights are chosen by magnitude.
DEFAULT_SIZE = 256


class AutoSubnetwork(AutoJoint, family="subnetwork"):
    """A full-covariance Gaussian over ``size`` chosen weights, point masses elsewhere.

    Parameters
    ----------
    model : callable
        The Pyro model.
    size : int, optional
        ``S``, the number of weights in the Gaussian: by default 256 with
        ``select="magnitude"``, or every weight of a smaller model; a ``size`` given above the
        model's real weights is refused when the guide is set up. With masks, the number they
        choose (another ``size`` is refused).
    select : "magnitude" or mapping, default "magnitude"
        How the weights are chosen: the largest ``|initial mean|`` over every real site (a
        baseline), or ``{site: bool mask shaped like the site, or flat indices}``. The paper's
        rule (largest diagonal-Laplace variance at the MAP) is :func:`zoo.subnetwork_guide`.
    rank : int, optional
        ``None``: a full covariance; an int: diagonal plus rank ``rank``.
    init_scale, init_loc_fn, init_module, create_plates
        See :class:`guides.base.PerSiteGuide`.
    """

    def __init__(
        self,
        model: Callable,
        size: int | None = None,
        select: str | Mapping = "magnitude",
        *,
        rank: int | None = None,
        init_scale: float = 0.01,
        init_loc_fn: str | Callable = "auto",
        init_module: nn.Module | None = None,
        create_plates: Callable | None = None,
    ):
        if not (isinstance(select, str) and select == "magnitude" or isinstance(select, Mapping)):
            raise InvalidArgument(
                f"select must be 'magnitude' or a mapping of site masks, got {select!r}; the "
                "paper's choice by marginal variance is zoo.subnetwork_guide(model, data, size)"
            )
        masks = select if isinstance(select, Mapping) else None
        if masks is not None:
            chosen = sum(indices(name, m).numel() for name, m in masks.items())
            if size is not None and size != chosen:
                raise InvalidArgument(
                    f"select's masks choose {chosen} weights and size={size!r}: the masks say "
                    "which weights, so pass size=None (or size=" + str(chosen) + ")"
                )
            size = chosen
        size_given = size is not None
        size = DEFAULT_SIZE if size is None else size
        check_int("size", size, 1, meaning="the weights in the Gaussian")
        check_size(size, rank)  # before any work: a full S x S factor must fit
        super().__init__(
            model,
            "*",
            masks=masks,
            rank=rank,
            rest="map",
            init_scale=init_scale,
            init_loc_fn=init_loc_fn,
            init_module=init_module,
            create_plates=create_plates,
        )
        self.size, self.selection = size, "masks" if masks is not None else "magnitude"
        self._size_given = size_given

    def select(self, names: list[str]) -> dict[str, torch.Tensor]:
        """The given masks, or the ``size`` largest ``|initial mean|`` over ``names`` (a size
        above their count is refused: it would quietly take them all)."""
        if self.selection == "masks":
            chosen = dict(self.masks)
        else:
            locs = [self.site_posterior(n).loc.detach().reshape(-1) for n in names]
            total = sum(loc.numel() for loc in locs)
            if self.size > total and not self._size_given:  # the default on a small model
                self.size = total
            elif self.size > total:
                raise ValueError(
                    f"size={self.size} is more than the model's {total} weights in real sites "
                    f"{names}: pass size <= {total} (size={total} puts every weight in the "
                    "Gaussian: the 'joint' family does that directly)"
                )
            chosen = top_scalars(names, [loc.abs() for loc in locs], self.size)
        empty = torch.zeros(0, dtype=torch.long)
        return {n: chosen.get(n, empty) for n in names}  # a site not chosen: point masses

    def spec(self) -> dict:
        """Plain data that rebuilds this guide with the scalars it chose."""
        masks = {name: index.tolist() for name, index in self.masks.items()}
        if len(masks) < len(self._joint):  # a site with every scalar chosen has no mask
            for name, index, _, count in self._joint:
                masks.setdefault(name, list(range(count)) if index is None else index.tolist())
        options = {"size": self.size, "select": masks, "rank": self.rank}
        return {"family": self.family, "options": options, "init_scale": self.init_scale}

    @classmethod
    def from_spec(cls, model: Callable, spec: dict) -> AutoSubnetwork:
        """The guide that :meth:`spec` describes (parameters not yet created)."""
        return cls(model, init_scale=spec["init_scale"], **spec["options"])

    @classmethod
    def from_fit(
        cls,
        fit: Any,
        size: int = 256,
        select: str = "variance",
        *,
        rank: int | None = None,
        init_scale: float = 0.01,
    ) -> AutoSubnetwork:
        """A subnetwork chosen from a fit (a ``zoo.FitResult``, or a fitted guide with its
        ``model``): the ``size`` weights of largest marginal variance under its posterior
        (``select="variance"``, a Gaussian family's fit such as the diagonal's) or largest
        ``|mean|`` (``"magnitude"``, a MAP fit), every mean starting at the fit's. Both are
        baselines: the paper ranks by a diagonal Laplace at the MAP
        (:func:`zoo.subnetwork_guide`)."""
        guide = getattr(fit, "guide", fit)
        model = getattr(fit, "model", None) or getattr(guide, "model", None)
        if not hasattr(guide, "median") or not hasattr(guide, "quantiles") or model is None:
            raise InvalidArgument(
                "from_fit takes a fit (zoo.fit's result) or a fitted guide of the package, got "
                f"{type(fit).__name__} {fit!r:.60}: fit first, e.g. "
                "AutoSubnetwork.from_fit(zoo.fit(model, 'diagonal', data), size)"
            )
        check_choice("select", select, ("variance", "magnitude"))
        check_int("size", size, 1, meaning="the weights in the Gaussian")
        check_size(size, rank)
        medians = {k: v.detach() for k, v in guide.median().items()}
        transforms = guide._transforms  # the package's own: a constrained site has one
        real = [n for n in guide.site_names if transforms.get(n) is None]
        if select == "variance":
            bounds = guide.quantiles([0.158655, 0.841345])  # mean -/+ 1 sd of each marginal
            spread = {n: ((bounds[n][1] - bounds[n][0]) / 2).detach() for n in real}
            if all(float(spread[n].abs().max()) == 0 for n in real):
                raise ValueError(
                    "the fit's posterior has no spread (a point mass): choose by "
                    "select='magnitude', or fit a Gaussian family such as the diagonal first"
                )
            scores = [spread[n].reshape(-1) for n in real]
        else:
            scores = [medians[n].abs().reshape(-1) for n in real]
        masks = top_scalars(real, scores, size)

        def start(site, medians=medians):
            return medians[site["name"]]

        chosen = sum(m.numel() for m in masks.values())
        if chosen < size:
            raise ValueError(
                f"size={size} is more than the fit's {chosen} weights in real sites: pass "
                f"size <= {chosen}"
            )
        return cls(model, None, masks, rank=rank, init_scale=init_scale, init_loc_fn=start)


def top_scalars(names: list[str], scores: list[torch.Tensor], size: int) -> dict:
    """``{site: flat indices}`` of the ``size`` largest ``scores`` over every site (all of
    them when there are fewer)."""
    flat = torch.cat([s.reshape(-1).float() for s in scores])
    size = min(size, flat.numel())
    chosen = torch.topk(flat, size).indices
    out, offset = {}, 0
    for name, score in zip(names, scores):
        numel = score.numel()
        inside = chosen[(chosen >= offset) & (chosen < offset + numel)] - offset
        if inside.numel():
            out[name] = torch.sort(inside).values.cpu()
        offset += numel
    return out
