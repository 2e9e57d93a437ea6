"""The training objective: the scaled ``-ELBO`` of a model and a guide, separate from any loop.

``zoo.fit``, the benchmarks and a user's own training loop all call the same object::

    objective = zoo.Objective(model, guide, kl_weight=1.0)
    optimizer = torch.optim.Adam(guide.parameters(), lr=1e-3)  # after objective.setup(x, y)
    for xb, yb in loader:
        optimizer.zero_grad()
        objective.loss(xb, yb, num_data=len(dataset)).backward()
        optimizer.step()

The loss is Pyro's ``Trace_ELBO`` (or ``TraceMeanField_ELBO``) ``differentiable_loss`` of the
model and guide, with the minibatch scaled to the full data set as :mod:`zoo.elbo` documents.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable

import pyro
import torch
from pyro.infer import Trace_ELBO, TraceMeanField_ELBO

from guides.site import direct_parameters
from zoo import estimators
from zoo.elbo import ElboScale
from zoo.models.base import BayesianModel

ELBOS = {"trace": Trace_ELBO, "meanfield": TraceMeanField_ELBO}


class Objective:
    """``-ELBO`` of ``model`` and ``guide`` on a minibatch, scaled to the full data set.

    Parameters
    ----------
    model : callable
        A Pyro model ``model(x, y=None)`` observing ``y`` in ``pyro.plate("data", len(x))``.
    guide : callable
        A guide of the model (e.g. a ``guides`` family instance).
    elbo : {"trace", "meanfield"}
        ``Trace_ELBO`` (Monte Carlo KL) or ``TraceMeanField_ELBO`` (closed-form KL where one is
        registered, which holds for every Gaussian family here against Normal priors).
    estimator : {"reparam", "local", "flipout"}
        How layers see the weight posterior (see :mod:`zoo.estimators`). Needs
        ``num_particles=1`` unless ``"reparam"``.
    num_particles : int
        ELBO samples per call, vectorised into one batched pass.
    kl_weight : float or callable
        Factor on the latent (KL) part, or ``step -> factor`` for annealing; ``1`` is the true
        ELBO.

    Notes
    -----
    The guide's parameters are read without a ``pyro.param`` statement per access (the same
    values as under Pyro's ``SVI``, constrained ones included) and Pyro's global param store is
    not used: optimise ``guide.parameters()`` (and the model's own, if any) directly.
    """

    def __init__(
        self,
        model: Callable,
        guide: Callable,
        *,
        elbo: str = "trace",
        estimator: str = "reparam",
        num_particles: int = 1,
        kl_weight: float | Callable[[int], float] = 1.0,
    ):
        if elbo not in ELBOS:
            raise ValueError(f"elbo must be 'trace' or 'meanfield', got {elbo!r}")
        estimators.check_estimator(estimator)
        if estimator != "reparam" and num_particles != 1:
            raise ValueError(
                f"estimator={estimator!r} draws independent noise per example already; use "
                "num_particles=1 (or estimator='reparam' with several particles)"
            )
        self.model, self.guide = model, guide
        self.elbo, self.estimator = elbo, estimator
        self.num_particles = int(num_particles)
        self.kl_weight = kl_weight
        self.scale = ElboScale()
        nesting = 1 if isinstance(model, BayesianModel) else float("inf")
        self._loss_fn = ELBOS[elbo](
            num_particles=self.num_particles,
            vectorize_particles=self.num_particles > 1,
            max_plate_nesting=nesting,
        ).differentiable_loss
        self.served: frozenset[str] = frozenset()
        self._wired: tuple[Callable, Callable] | None = None

    def setup(self, x: torch.Tensor, y: torch.Tensor | None = None) -> None:
        """Create the guide's parameters on an example batch (its prototype trace, if not yet
        made) and find the sites the estimator serves. ``loss`` calls it on first use; call it
        yourself before building an optimiser over ``guide.parameters()``."""
        with torch.no_grad(), direct_parameters():
            if getattr(self.guide, "prototype_trace", True) is None:
                self.guide(x, y)
            skip = frozenset()
            if self.estimator != "reparam":
                self.served, skip = estimators.plan(
                    self.model, self.guide, self.estimator, self.elbo, x, y
                )
                if not self.served:
                    raise ValueError(
                        f"estimator={self.estimator!r} serves no weight of this guide: 'local' "
                        "needs a family with local reparameterisation (diagonal, matrix normal, "
                        "MC dropout, point mass) "
                        "on linear layers, 'flipout' one whose deviations are sign-symmetric "
                        "(diagonal). Use estimator='reparam', or guides.AutoMixed to give those "
                        "layers such a family."
                    )
        self._wired = estimators.wire(
            self.scale(self.model), self.scale(self.guide), self.estimator, skip
        )

    def kl_weight_at(self, step: int) -> float:
        """The KL weight at optimiser step ``step``."""
        return float(self.kl_weight(step) if callable(self.kl_weight) else self.kl_weight)

    def loss(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        num_data: int,
        step: int = 0,
        validate: bool = False,
    ) -> torch.Tensor:
        """``-ELBO`` estimated on the minibatch ``(x, y)`` of a data set of ``num_data``
        examples (likelihood scaled by ``num_data / len(x)``), a differentiable scalar.

        ``step`` picks the KL weight of a schedule; ``validate`` turns on Pyro's argument and
        support checks for this call (``zoo.fit`` does so on its first step).
        """
        if self._wired is None:
            self.setup(x, y)
        self.scale.data_scale = num_data / x.shape[0]
        self.scale.kl_weight = self.kl_weight_at(step)
        with loss_context(validate):
            return self._loss_fn(*self._wired, x, y)

    __call__ = loss


@contextlib.contextmanager
def loss_context(validate: bool = False):
    """How a loss is evaluated: Pyro's validation only when asked, site parameters read
    directly, and no NaN warnings (``zoo.fit`` reports non-finite losses more clearly)."""
    with pyro.validation_enabled(validate), direct_parameters(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Encountered NaN")
        yield
