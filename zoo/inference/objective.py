"""The training objective: the scaled ``-ELBO`` of a model and a guide, separate from any loop.

``zoo.fit``, the benchmarks and a user's own training loop all call the same object::

    objective = zoo.Objective(model, guide, kl_weight=1.0)
    optimizer = torch.optim.Adam(guide.parameters(), lr=1e-3)  # after objective.setup(x, y)
    for xb, yb in loader:
        optimizer.zero_grad()
        objective.loss(xb, yb, num_data=len(dataset)).backward()
        optimizer.step()

The loss is Pyro's ``Trace_ELBO`` (or ``TraceMeanField_ELBO``) of the model and guide, with the
minibatch scaled to the full data set as :mod:`zoo.inference.elbo` documents, reduced as
:mod:`zoo.inference.surrogate` says: one sum per scale, and no value read back to the host.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from typing import Any

import pyro
import torch

from guides.site import direct_parameters
from zoo.inference import estimators
from zoo.inference.backends import EagerLoss, LossBackend
from zoo.inference.compiled import TracedLoss, compile_refusal
from zoo.inference.elbo import ElboScale
from zoo.inference.surrogate import ReparamMeanField_ELBO, ReparamTrace_ELBO
from zoo.models.base import BayesianModel
from zoo.models.statistics import frozen_statistics
from zoo.runtime.threads import example_flops

ELBOS = {"trace": ReparamTrace_ELBO, "meanfield": ReparamMeanField_ELBO}


class Objective:
    """``-ELBO`` of ``model`` and ``guide`` on a minibatch, scaled to the full data set.

    Parameters
    ----------
    model : callable
        A Pyro model ``model(x, y=None)`` observing ``y`` in ``pyro.plate("data", len(x))``.
    guide : callable
        A guide of the model (e.g. a ``guides`` family instance).
    elbo : {"trace", "meanfield"} or None
        ``Trace_ELBO`` (Monte Carlo KL) or ``TraceMeanField_ELBO`` (closed-form KL where one is
        registered, which holds for every Gaussian family here against Normal priors); ``None``
        (a family's own beside ``estimator="auto"``): ``"meanfield"`` when the estimator serves a
        layer, ``"trace"`` when it serves none, decided by :meth:`setup` (:attr:`elbo` says).
    estimator : {"reparam", "local", "flipout", "auto"}
        How layers see the weight posterior (see :mod:`zoo.inference.estimators`). ``"local"``
        and ``"flipout"`` need ``num_particles=1``; ``"auto"`` is ``"reparam"`` with several
        particles or where it serves no layer (:attr:`estimator` then says so).
    num_particles : int
        ELBO samples per call, vectorised into one batched pass.
    kl_weight : float or callable
        Factor on the latent (KL) part, or ``step -> factor`` for annealing; ``1`` is the true
        ELBO.
    jit : "auto", bool
        Evaluate the loss through a graph traced once per minibatch shape
        (:mod:`zoo.inference.compiled`): the same value and gradients as the eager loss, without its
        per-step Python. ``"auto"``: for ``zoo`` models with a ``guides`` family and one
        particle (:func:`zoo.inference.compiled.compile_refusal`), at any size, eagerly otherwise
        or when a graph fails its check (with a warning); ``True``: the same, raising instead of
        falling back; ``False``: always eager. The decision never depends on the run's length,
        so a fit extended by a resume computes what the longer fit computes.

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
        elbo: str | None = "trace",
        estimator: str = "reparam",
        num_particles: int = 1,
        kl_weight: float | Callable[[int], float] = 1.0,
        jit: bool | str = "auto",
    ):
        check_jit(jit)
        if elbo is not None:
            check_elbo(elbo)
        estimators.check_estimator(estimator)
        if estimator == "auto" and num_particles != 1:  # several particles: one draw each
            estimator = "reparam"
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
        self._nesting = nesting
        self._elbo = self._make_elbo(elbo or "trace")
        self.served: frozenset[str] = frozenset()
        self._wired: tuple[Callable, Callable] | None = None
        self.jit = jit
        #: The backend that evaluates the loss when it can (:mod:`zoo.inference.backends`;
        #: ``None``: every call is eager), and the eager one every other call takes.
        self.backend: LossBackend | None = None
        self.eager: EagerLoss | None = None
        self._eager_reason: str | None = "not set up yet"
        self._example_flops: float | None = None
        self._setup_batch: tuple[torch.Tensor, torch.Tensor | None] | None = None
        #: Examples in the minibatches of the fit (:meth:`setup`'s ``batch_size``).
        self.minibatch_size = 0
        self._warned = False

    def _make_elbo(self, elbo: str):
        return ELBOS[elbo](
            num_particles=self.num_particles,
            vectorize_particles=self.num_particles > 1,
            max_plate_nesting=self._nesting,
        )

    @classmethod
    def from_loss(
        cls, model: Callable, guide: Callable, loss: Any, *, jit: str | bool
    ) -> Objective:
        """The objective a ``zoo.Loss`` group ``loss`` describes (its ``elbo``, ``estimator``,
        ``num_particles`` and ``kl_weight``), evaluated as ``jit`` says: how ``zoo.fit`` and
        ``zoo.lightning.BayesianModule`` build theirs."""
        return cls(
            model,
            guide,
            elbo=loss.elbo,
            estimator=loss.estimator,
            num_particles=loss.num_particles,
            kl_weight=loss.kl_weight,
            jit=jit,
        )

    def setup(
        self, x: torch.Tensor, y: torch.Tensor | None = None, batch_size: int | None = None
    ) -> None:
        """Create the guide's parameters on an example batch (its prototype trace, if not yet
        made) and find the sites the estimator serves. ``loss`` calls it on first use; call it
        yourself before building an optimiser over ``guide.parameters()``.

        ``batch_size`` is the number of examples in the minibatches the loss will see (default:
        ``len(x)``; :attr:`minibatch_size`): the size rules of :mod:`zoo.training.rules`
        (``jit="auto"``, the thread count) weigh the forward pass of a minibatch that size, not
        of the example batch, which may be two examples (:meth:`forward_flops`); and a smaller
        minibatch (the last of an epoch) is evaluated eagerly, without a graph of its own."""
        # Pyro's argument checks run on the first step (``validate``), not on this trace too.
        with torch.no_grad(), direct_parameters(), pyro.validation_enabled(False):
            if getattr(self.guide, "prototype_trace", True) is None:
                self.guide(x, y)
            skip: frozenset[str] = frozenset()
            if self.estimator != "reparam":
                rows = len(x) if batch_size is None else int(batch_size)
                self.served, skip = estimators.plan(
                    self.model, self.guide, self.estimator, self.elbo or "meanfield", x, y,
                    rows=rows,
                )  # fmt: skip
                if not self.served and self.estimator == "auto":  # a shared draw everywhere
                    self.estimator, skip = "reparam", frozenset()
                elif not self.served:
                    raise ValueError(
                        f"estimator={self.estimator!r} serves no weight of this guide: 'local' "
                        "needs a family with local reparameterisation (diagonal, matrix normal, "
                        "MC dropout, point mass) "
                        "on linear layers, 'flipout' one whose deviations are sign-symmetric "
                        "(diagonal). Use estimator='reparam', or guides.AutoMixed to give those "
                        "layers such a family."
                    )
        if self.elbo is None:  # the family's: closed-form where layers are served undrawn
            self.elbo = "meanfield" if self.served else "trace"
            self._elbo = self._make_elbo(self.elbo)
        only = self.served if self.estimator == "auto" else None
        self._wired = estimators.wire(
            self.scale(self.model), self.scale(self.guide), self.estimator, skip, only
        )
        self.backend, self._example_flops = None, None
        self._setup_batch = (x, y)
        self.minibatch_size = len(x) if batch_size is None else int(batch_size)
        self._eager_reason = self._why_eager(x, y)
        params = [p for _, p in named_parameters(self.guide, self.model) if p.requires_grad]
        wired = (self._elbo, *self._wired, params, self.scale, loss_context)
        self.eager = EagerLoss(*wired)
        if self._eager_reason is None:
            self.backend = TracedLoss(*wired)

    def use(self, backend: LossBackend) -> None:
        """Evaluate the loss through ``backend`` from now on (after :meth:`setup`, which picks
        the traced backend or none by ``jit``); a call it declines runs eagerly."""
        if self._wired is None:
            raise RuntimeError("call setup(x, y) before choosing a backend")
        self.backend, self._eager_reason = backend, None

    def _why_eager(self, x: torch.Tensor, y: torch.Tensor | None) -> str | None:
        """Why the loss is not compiled (``None``: it is); raises under ``jit=True``."""
        if not self.jit:
            return "jit=False"
        refusal = compile_refusal(self.model, self.guide, self.num_particles, x.device)
        if refusal is not None and self.jit is True:
            raise ValueError(f"jit=True cannot compile this loss: {refusal}")
        return refusal

    def flops_per_example(self) -> float:
        """Floating-point operations of the model's forward pass per example
        (:func:`zoo.runtime.threads.example_flops` on the batch given to :meth:`setup`), counted
        once."""
        if self._example_flops is None:
            if self._setup_batch is None:
                raise RuntimeError("call setup(x, y) (or loss) first")
            self._example_flops = example_flops(self.model, *self._setup_batch)
            self._setup_batch = None  # counted: the batch is not kept
        return self._example_flops

    def forward_flops(self) -> int:
        """Floating-point operations of the model's forward pass on one minibatch of
        :meth:`setup`'s ``batch_size`` examples: :meth:`flops_per_example` times that size."""
        return round(self.flops_per_example() * self.minibatch_size)

    @property
    def wired(self) -> tuple[Callable, Callable]:
        """The model and guide the loss evaluates (after :meth:`setup`): wrapped in
        :attr:`scale` (:mod:`zoo.inference.elbo`) and the estimator's handlers
        (:mod:`zoo.inference.estimators`)."""
        if self._wired is None:
            raise RuntimeError("call setup(x, y) (or loss) first")
        return self._wired

    @property
    def jit_state(self) -> str:
        """How the loss has been evaluated: ``"compiled"``, or ``"eager"`` with the reason."""
        reason = self._eager_reason
        if reason is None and self.backend is not None:  # set up with a backend
            reason = self.backend.refused
            if reason is None:
                return self.backend.name
        return f"eager ({reason})"

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
        eager: bool = False,
    ) -> torch.Tensor:
        """``-ELBO`` estimated on the minibatch ``(x, y)`` of a data set of ``num_data``
        examples (likelihood scaled by ``num_data / len(x)``), a differentiable scalar.

        ``step`` (the fit's global step) picks the KL weight of a schedule; ``validate`` turns on
        Pyro's argument and support checks for this call (``zoo.fit`` does so on its first step);
        ``eager`` evaluates it without a graph (a single evaluation, which a graph would not
        repay). A minibatch smaller than :attr:`minibatch_size` (the last of an epoch when ``B``
        does not divide ``N``) is evaluated eagerly too: it comes once an epoch, and a graph of its
        own (traced, optimised by TorchScript's executor and checked) costs tens of eager steps to
        build (``benchmarks/README.md`` at ``91a332b``, "Start-up").
        """
        return self._loss(x, y, num_data / x.shape[0], step, validate, eager)

    def loss_with_data_term(
        self, x: torch.Tensor, y: torch.Tensor, num_data: int, step: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`loss` (compiled where it is), and the 0-d leaf ``s = N / B`` it scaled the
        likelihood by. The loss is ``s * D + kl_weight * KL`` with ``D = -sum_b log p(y_b | w)``
        over the minibatch (every site inside the data plate) on the same draw, so after a
        ``backward`` of ``c * loss``, ``s.grad`` is ``c * D``: the data term read from the
        evaluation itself, without a second pass for the KL (the rate test's,
        :mod:`zoo.training.rate`)."""
        if self._wired is None:
            self.setup(x, y)
        params = [p for _, p in named_parameters(self.guide, self.model)]
        dtype = params[0].dtype if params else torch.get_default_dtype()
        data_scale = num_data / x.shape[0]
        leaf = torch.tensor(data_scale, dtype=dtype, device=x.device, requires_grad=True)
        return self._loss(x, y, data_scale, step, False, False, leaf), leaf

    def _loss(self, x, y, data_scale: float, step: int, validate: bool, eager: bool, leaf=None):
        """The loss at these scales; ``leaf``, a 0-d tensor of ``data_scale``'s value, in its
        place where given (:meth:`loss_with_data_term`)."""
        if self._wired is None:
            self.setup(x, y)
        assert self.eager is not None  # made by setup
        kl_weight = self.kl_weight_at(step)
        small = x.shape[0] < self.minibatch_size
        if self.backend is not None and not (validate or eager or small) and y is not None:
            value = self.backend(x, y, data_scale, kl_weight, leaf)
            if value is not None:
                return value
            if self.backend.refused is not None:
                self._refused()
        scale = data_scale if leaf is None else leaf
        return self.eager(x, y, scale, kl_weight, validate=validate)

    @torch.no_grad()
    def kl(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """A one-draw estimate of ``KL(q || p)`` on ``(x, y)`` (closed form with
        ``elbo="meanfield"``): the eager loss with the likelihood scaled to zero and the KL
        weight one. Batch norm's running statistics are left alone (not a training step)."""
        with frozen_statistics():
            if self._wired is None:
                self.setup(x, y)
            assert self.eager is not None  # made by setup
            return self.eager(x, y, 0.0, 1.0).detach()

    def _refused(self) -> None:
        """A graph failed: an error under ``jit=True``, one warning under ``"auto"``."""
        family = getattr(self.guide, "family", None) or type(self.guide).__name__
        which = f"{family} guide, estimator={self.estimator!r}, elbo={self.elbo!r}"
        refused = self.backend.refused if self.backend is not None else None
        if self.jit is True:
            raise RuntimeError(f"jit=True cannot compile this loss ({which}): {refused}")
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"the loss ({which}) is evaluated eagerly: {refused} (jit=False silences this)",
                RuntimeWarning,
                stacklevel=4,
            )

    __call__ = loss


def check_jit(jit) -> None:
    """Refuse a ``jit`` that is not ``"auto"``, ``True`` or ``False``."""
    if jit not in (True, False, "auto"):
        raise ValueError(f"jit must be 'auto', True or False, got {jit!r}")


def check_elbo(elbo) -> None:
    """Refuse an ``elbo`` that is not one of :data:`ELBOS`."""
    if elbo not in ELBOS:
        raise ValueError(f"elbo must be 'trace' or 'meanfield', got {elbo!r}")


@contextlib.contextmanager
def loss_context(validate: bool = False):
    """How a loss is evaluated: Pyro's validation only when asked, site parameters read
    directly, and no NaN warnings (``zoo.fit`` reports non-finite losses more clearly)."""
    with pyro.validation_enabled(validate), direct_parameters(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Encountered NaN")
        yield


def named_parameters(guide, model) -> list[tuple[str, torch.Tensor]]:
    """The guide's parameters and the model's own (``model.``-prefixed), as a fit sees them."""
    named = list(guide.named_parameters())
    if isinstance(model, torch.nn.Module):
        named += [(f"model.{n}", p) for n, p in model.named_parameters()]
    return named
