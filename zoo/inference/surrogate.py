"""Pyro's ELBOs for reparameterised guides, summed per scale group and without host reads.

:class:`ReparamTrace_ELBO` and :class:`ReparamMeanField_ELBO` are Pyro's ``Trace_ELBO`` and
``TraceMeanField_ELBO`` with the same traces (the guide's, then the model replayed against it),
the same estimator and the same scaling (:mod:`zoo.inference.elbo`), reduced differently. Pyro
scales and sums each site's log-density on its own (``compute_log_prob``), adds the sites one by
one, and reads every site's value on the host (``.item()``) for the reported loss: on a GPU each
read waits for the device, and each site costs its own scale, sum and addition kernels (a node each
in a CUDA graph). Here the sites are grouped by their scale (the weights under ``kl_weight``, the
likelihood under ``N / B``), and one draw's loss is::

    -ELBO = -( sum_groups  scale_g * ( sum_{sites in g} log p  -  sum_{sites in g} log q ) )

with each group's 0-d log-densities stacked and summed once (``TraceMeanField_ELBO``: the
closed-form ``KL(q || p)`` of a weight site in place of its ``log p - log q``, Monte Carlo
where none is registered). The value is the ``-ELBO`` estimate itself, a tensor on the model's
device, and it is also the surrogate whose gradient is followed: every site of the guide is
reparameterised, so the two coincide (Pyro returns the same value and gradient, summed in
another order; ``tests/zoo/test_surrogate.py`` compares them).

Everything here goes through Pyro's public API: ``poutine.trace`` and ``poutine.replay`` make the
traces (``pyro.infer.enum.get_importance_trace`` with all its checks under Pyro's validation,
``zoo.fit``'s first step: the reduction then reads the unscaled log-densities those checks
computed, so a validated step computes the same numbers as any other), several particles run in
one ``pyro.plate`` as Pyro vectorises them, and a program these reductions do not cover (a guide
site without ``rsample``, a masked site) is handed to Pyro's own ELBO,
``Trace_ELBO().differentiable_loss``, on the same draws: the generators are put back to where
the first trace of that program started (its reducibility is then known, and later calls go to
Pyro's ELBO at once).
"""

from __future__ import annotations

import functools
import numbers
import operator
from typing import Any

import pyro
import torch
from pyro import poutine
from pyro.distributions.kl import kl_divergence
from pyro.infer import Trace_ELBO, TraceMeanField_ELBO
from pyro.infer.enum import get_importance_trace
from pyro.infer.util import is_validation_enabled
from pyro.poutine.util import prune_subsample_sites
from pyro.util import check_if_enumerated


class _Groups:
    """Terms to add (``log p``) and to subtract (``log q``, a KL) per scale, in first-use
    order. A key is the site's role (observed or latent) and its scale: the scale tensor itself
    in a traced graph, its value in an eager step, so both reduce the same sites together."""

    def __init__(self):
        # (is observed, scale or its id) -> (scale, added terms, subtracted terms)
        self.groups: dict[tuple, tuple[Any, list[torch.Tensor], list[torch.Tensor]]] = {}

    def add(self, site: dict, term: torch.Tensor, sign: int) -> None:
        scale = site["scale"]
        key = (site["is_observed"], scale if isinstance(scale, numbers.Number) else id(scale))
        if key not in self.groups:
            self.groups[key] = (scale, [], [])
        self.groups[key][1 if sign > 0 else 2].append(term)

    def total(self) -> torch.Tensor:
        """``sum_g scale_g * (sum of the added terms - sum of the subtracted ones)``."""
        total: torch.Tensor | None = None
        for scale, plus, minus in self.groups.values():
            value = _summed(plus) if plus else None
            if minus:
                less = _summed(minus)
                value = -less if value is None else value - less
            assert value is not None  # a group is made by its first term
            if not (isinstance(scale, numbers.Number) and scale == 1):
                value = value * scale
            total = value if total is None else total + value
        if total is None:
            raise ValueError("the trace has no log-density term to sum (no sample site)")
        return total


def _summed(terms: list[torch.Tensor]) -> torch.Tensor:
    """The sum of every element of ``terms`` (at least one): one ``stack`` and one ``sum`` for
    0-d terms."""
    if len(terms) == 1:
        return terms[0] if terms[0].dim() == 0 else terms[0].sum()
    if all(term.dim() == 0 for term in terms):
        return torch.stack(terms).sum()
    return torch.cat([term.reshape(-1) for term in terms]).sum()


def _log_prob(site: dict) -> torch.Tensor:
    """A site's unscaled log-density (Pyro's, when its validated trace computed it)."""
    if "unscaled_log_prob" in site:
        return site["unscaled_log_prob"]
    return site["fn"].log_prob(site["value"], *site["args"], **site["kwargs"])


def reducible(model_trace, guide_trace) -> bool:
    """Whether this module's reduction covers a draw: every sample site of the guide is
    reparameterised and no site of either trace carries a mask."""
    for trace in (model_trace, guide_trace):
        for site in trace.nodes.values():
            if site["type"] != "sample":
                continue
            if site["mask"] is not None or (trace is guide_trace and not site["fn"].has_rsample):
                return False
    return True


class _Reduced:
    """What both ELBOs share: the traces, the reduction, and Pyro's ELBO (``pyro_class``) for
    what the reduction does not cover. The constructor takes Pyro's ELBO's arguments."""

    pyro_class: type

    def __init__(
        self,
        num_particles: int = 1,
        max_plate_nesting: float = float("inf"),
        vectorize_particles: bool = False,
    ):
        self.pyro = self.pyro_class(
            num_particles=num_particles,
            max_plate_nesting=max_plate_nesting,
            vectorize_particles=vectorize_particles,
        )
        self.num_particles, self.vectorize_particles = num_particles, vectorize_particles
        self.max_plate_nesting = self.pyro.max_plate_nesting  # one more for vectorised particles
        #: ``(id(model), id(guide)) -> (model, guide, reducible)`` of the programs seen.
        self._programs: dict[tuple[int, int], tuple] = {}

    def differentiable_loss(self, model, guide, *args, **kwargs) -> torch.Tensor:
        """The ``-ELBO`` estimate averaged over ``num_particles`` draws, differentiable. For
        reducible draws its value never passes through the host (no ``.item()``, no NaN check:
        ``zoo.fit`` checks the loss on the device); other programs get Pyro's
        ``differentiable_loss`` on the same draws."""
        key = (id(model), id(guide))
        known = self._programs.get(key)
        if known is not None and not known[2]:
            return self.pyro.differentiable_loss(model, guide, *args, **kwargs)
        start = _generator_states(args) if known is None else None
        draws = []
        for model_trace, guide_trace in self._traces(model, guide, args, kwargs):
            if not reducible(model_trace, guide_trace):
                self._programs[key] = (model, guide, False)
                _set_generator_states(start)  # Pyro's ELBO draws what this trace drew
                return self.pyro.differentiable_loss(model, guide, *args, **kwargs)
            draws.append(self._particle(model_trace, guide_trace))
        self._programs[key] = (model, guide, True)
        return self._mean(draws)

    def _traces(self, model, guide, args, kwargs):
        """``(model_trace, guide_trace)`` per draw: one vectorised pair for several particles
        in a plate (as Pyro's ELBO makes them), else ``num_particles`` pairs."""
        if self.num_particles > 1 and self.vectorize_particles:
            plate = pyro.plate("num_particles_vectorized", self.num_particles,
                               dim=-self.max_plate_nesting)  # fmt: skip
            yield self._trace(plate(model), plate(guide), args, kwargs)
            return
        for _ in range(self.num_particles):
            yield self._trace(model, guide, args, kwargs)

    def _trace(self, model, guide, args, kwargs):
        """The guide's trace and the model's replayed against it; under validation (or for a
        ``GuideMessenger``) Pyro's ``get_importance_trace`` and its checks."""
        if is_validation_enabled() or isinstance(
            poutine.unwrap(guide), poutine.messenger.Messenger
        ):
            model_trace, guide_trace = get_importance_trace(
                "flat", self.max_plate_nesting, model, guide, args, kwargs
            )
            if is_validation_enabled():
                check_if_enumerated(guide_trace)
            return model_trace, guide_trace
        guide_trace = poutine.trace(guide, graph_type="flat").get_trace(*args, **kwargs)
        replayed = poutine.replay(model, trace=guide_trace)
        model_trace = poutine.trace(replayed, graph_type="flat").get_trace(*args, **kwargs)
        return prune_subsample_sites(model_trace), prune_subsample_sites(guide_trace)

    def _particle(self, model_trace, guide_trace) -> torch.Tensor:
        """The reduced ``-ELBO`` of one draw (its value and its surrogate at once)."""
        groups = _Groups()
        for name, site in model_trace.nodes.items():
            if site["type"] != "sample":
                continue
            if site["is_observed"] or name not in guide_trace.nodes:
                groups.add(site, _log_prob(site), +1)  # a latent the model draws itself too
            else:
                self._latent(groups, site, guide_trace.nodes[name])
        for name, site in guide_trace.nodes.items():  # auxiliary sites of the guide
            if site["type"] == "sample" and name not in model_trace.nodes:
                groups.add(site, _log_prob(site), -1)
        return -groups.total()

    def _latent(self, groups: _Groups, model_site: dict, guide_site: dict) -> None:
        """Add a weight site's ``log p - log q`` (the Monte Carlo estimate of ``-KL``)."""
        groups.add(model_site, _log_prob(model_site), +1)
        groups.add(guide_site, _log_prob(guide_site), -1)

    def _mean(self, values: list[torch.Tensor]) -> torch.Tensor:
        """The particles' mean: one draw's value as it is, else the sum over the traces (one
        vectorised trace holds them all) over ``num_particles``."""
        if self.num_particles == 1:
            return values[0]
        return functools.reduce(operator.add, values) / self.num_particles


def _generator_states(args) -> dict:
    """torch's CPU generator state, and the CUDA one of the inputs' device, to restore."""
    states: dict[str | torch.device, torch.Tensor] = {"cpu": torch.get_rng_state()}
    devices = {a.device for a in args if torch.is_tensor(a) and a.device.type == "cuda"}
    for device in devices:
        states[device] = torch.cuda.get_rng_state(device)
    return states


def _set_generator_states(states: dict | None) -> None:
    if states is None:  # a program that reduced before and not now: fresh draws
        return
    for device, state in states.items():
        if device == "cpu":
            torch.set_rng_state(state)
        else:
            torch.cuda.set_rng_state(state, device)


class ReparamTrace_ELBO(_Reduced):
    """Pyro's ``Trace_ELBO`` with the reduction of :mod:`zoo.inference.surrogate`: a latent site
    contributes ``scale * (log p(w) - log q(w))`` at the guide's draw ``w``."""

    pyro_class = Trace_ELBO


class ReparamMeanField_ELBO(_Reduced):
    """Pyro's ``TraceMeanField_ELBO`` with the reduction of :mod:`zoo.inference.surrogate`: a
    latent site contributes ``-scale * KL(q || p)`` in closed form where one is registered (every
    Gaussian family here against Normal priors), ``scale * (log p(w) - log q(w))`` otherwise."""

    pyro_class = TraceMeanField_ELBO

    def _latent(self, groups: _Groups, model_site: dict, guide_site: dict) -> None:
        try:
            kl = kl_divergence(guide_site["fn"], model_site["fn"])
        except NotImplementedError:
            return super()._latent(groups, model_site, guide_site)
        if not torch.is_tensor(kl):  # a constant KL, once per element of the batch shape
            numel = torch.Size(guide_site["fn"].batch_shape).numel()
            kl = torch.as_tensor(kl * numel, device=guide_site["value"].device)
        groups.add(guide_site, kl, -1)


__all__ = ["ReparamMeanField_ELBO", "ReparamTrace_ELBO", "reducible"]
