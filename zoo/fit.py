"""``zoo.fit``: stochastic variational inference with Pyro's ELBOs and a torch optimiser."""

from __future__ import annotations

import contextlib
import fnmatch
import inspect
import math
import os
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import pyro
import torch
from pyro.infer import Trace_ELBO, TraceMeanField_ELBO
from pyro.infer.autoguide import AutoGuide
from tqdm import tqdm

import guides as guide_registry
from guides.base import direct_parameters
from zoo import estimators, persist
from zoo.data_checks import (
    Batches,
    as_tensors,
    check_data,
    check_input_shape,
    check_labelled_data,
    check_labels,
    gather_tensors,
)
from zoo.elbo import ElboScale
from zoo.models.base import BayesianModel

_OPTIMIZERS = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}


#: With ``on_divergence="skip"``, this many non-finite steps in a row stop the fit.
MAX_CONSECUTIVE_SKIPS = 100
#: Steps between the in-memory copies of the parameters that a diverged fit goes back to.
LAST_GOOD_EVERY = 10


class FitDivergedError(FloatingPointError):
    """The loss or a gradient became NaN or infinite. ``result`` holds the fit up to the last
    finite step: its guide is back at the parameters that gave the last finite loss and
    gradients at one of the last ``LAST_GOOD_EVERY`` finite steps (the message says which)."""

    def __init__(self, message: str, result: FitResult):
        super().__init__(message)
        self.result = result


@dataclass
class FitState:
    """What a callback sees after every step. Return ``True`` from the callback to stop."""

    step: int
    epoch: int
    loss: float
    epoch_end: bool
    result: FitResult


@dataclass
class FitResult:
    """A fitted model and guide with their training history.

    Attributes
    ----------
    model, guide
        The model and the fitted guide (on ``device``).
    losses : list of float
        ``-ELBO`` estimate per step, on the full-data scale (see ``zoo.elbo``).
    epoch_losses : list of float
        Mean of ``losses`` over each completed epoch.
    wall_time : float
        Seconds spent in the training loop.
    skipped_steps : list of int
        Steps skipped for a non-finite loss or gradient (``on_divergence="skip"``).
    """

    model: Callable
    guide: AutoGuide
    losses: list[float] = field(default_factory=list)
    epoch_losses: list[float] = field(default_factory=list)
    wall_time: float = 0.0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    options: dict = field(default_factory=dict)
    interrupted: bool = False
    skipped_steps: list[int] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return len(self.losses)

    @property
    def family(self) -> str:
        return getattr(type(self.guide), "__name__", "guide")

    def predict(
        self,
        x: torch.Tensor,
        num_samples: int = 100,
        batch_size: int | None = None,
        progress: bool = True,
    ):
        """Posterior predictive on ``x`` from ``num_samples`` sampled networks, evaluated in
        blocks of inputs (see :func:`zoo.predictive.predict`; its progress bar appears after
        two seconds)."""
        from zoo.predictive import predict

        return predict(
            self.model,
            self.guide,
            x,
            num_samples=num_samples,
            batch_size=batch_size,
            progress=progress,
        )

    def save(self, path: str | os.PathLike) -> os.PathLike:
        """Write the model, the fitted guide and the history to ``path`` (atomically).

        Load with ``zoo.load(path)``; the model is pickled, so its class must be importable.
        """
        return persist.atomic_save(
            {
                "format": persist.FORMAT,
                "version": persist.VERSION,
                "kind": "fit",
                "model": self.model,
                "guide": self.guide,
                "losses": self.losses,
                "epoch_losses": self.epoch_losses,
                "wall_time": self.wall_time,
                "options": self.options,
                "skipped_steps": self.skipped_steps,
            },
            path,
        )

    def to_arviz(
        self,
        data=None,
        num_samples: int = 200,
        var_names=None,
        seed: int | None = 0,
        progress: bool = True,
    ):
        """ArviZ ``InferenceData`` of this fit; see :func:`zoo.arviz.to_inference_data`."""
        from zoo.arviz import to_inference_data

        return to_inference_data(
            self, data, num_samples=num_samples, var_names=var_names, seed=seed, progress=progress
        )

    def evaluate(
        self,
        data,
        num_samples: int = 100,
        batch_size: int | None = None,
        seed: int | None = 0,
        progress: bool = True,
    ) -> dict[str, float]:
        """Metrics on held-out ``data`` (``(X, y)``, a ``Dataset`` or a ``DataLoader``).

        Classification: ``accuracy``, ``nll`` (mean negative log predictive probability),
        ``brier``, ``ece`` (15 bins). Regression: ``rmse``, ``nll`` (of the sample mixture),
        ``coverage_95`` (central 95% predictive interval).
        """
        from zoo import metrics

        x, y = gather_tensors(data)
        check_labelled_data(self.model, x, y, self.device)
        if seed is not None:
            pyro.set_rng_seed(seed)
        pred = self.predict(x, num_samples=num_samples, batch_size=batch_size, progress=progress)
        y = y.to(pred.outputs.device)
        if self.model.task == "classification":
            probs = pred.probs
            return {
                "accuracy": metrics.accuracy(probs, y),
                "nll": metrics.nll(probs, y),
                "brier": metrics.brier(probs, y),
                "ece": metrics.ece(probs, y),
            }
        y = y.reshape(pred.mean.shape)
        lower, upper = pred.interval(0.95)
        return {
            "rmse": metrics.rmse(pred.mean, y),
            "nll": metrics.gaussian_mixture_nll(pred.sample_means, pred.sample_scales, y),
            "coverage_95": metrics.interval_coverage(lower, upper, y),
        }


def fit(
    model: Callable,
    guide: str | type | Callable | AutoGuide,
    data,
    *,
    epochs: int = 1,
    num_steps: int | None = None,
    batch_size: int = 128,
    lr: float = 1e-3,
    optimizer: str | type = "adam",
    optimizer_options: Mapping | None = None,
    lr_schedule: Callable[[int], float] | None = None,
    lr_multipliers: Mapping[str, float] | None = None,
    num_particles: int = 1,
    kl_weight: float | Callable[[int], float] = 1.0,
    elbo: str = "trace",
    guide_options: Mapping | None = None,
    device: str | torch.device = "auto",
    seed: int | None = 0,
    progress: bool = True,
    callbacks: Iterable[Callable[[FitState], bool | None]] = (),
    on_divergence: str = "raise",
    clip_grad_norm: float | None = None,
    per_example: bool = False,
    estimator: str = "reparam",
    checkpoint: str | os.PathLike | None = None,
    checkpoint_every: int | None = None,
    resume: str | os.PathLike | None = None,
) -> FitResult:
    """Fit a variational posterior to a Pyro model by stochastic variational inference.

    Each step draws a minibatch, estimates the full-data ELBO with Pyro's ``Trace_ELBO``
    (or ``TraceMeanField_ELBO``), and takes one step of a torch optimiser on ``-ELBO``.
    Minibatches are unbiased for the full-data ELBO: sites in ``pyro.plate("data", B)`` are
    scaled by ``N / B`` (see :mod:`zoo.elbo`).

    Parameters
    ----------
    model : callable
        A Pyro model ``model(x, y=None)`` that observes ``y`` in ``pyro.plate("data", len(x))``,
        e.g. any ``zoo.models`` network.
    guide : str, AutoGuide subclass, callable or AutoGuide
        A family name (``"diagonal"``, ``"lowrank"``, ``"tridiagonal"``, ``"matrix_normal"``),
        a guide class (built as ``cls(model, **guide_options)``), a callable
        ``model -> guide``, or a guide instance.
    data : (X, y), Dataset or DataLoader
        Training data; ``N = len(data)``.
    epochs : int, default 1
        Passes over the data (ignored when ``num_steps`` is given).
    num_steps : int, optional
        Total optimiser steps, cycling over the data as needed.
    batch_size : int, default 128
        Minibatch size (a DataLoader keeps its own).
    lr : float, default 1e-3
        Learning rate.
    optimizer : {"adam", "adamw", "sgd"} or torch optimizer class
    optimizer_options : mapping, optional
        Extra optimizer arguments, e.g. ``{"momentum": 0.9}``.
    lr_schedule : callable, optional
        ``step -> factor`` multiplying ``lr`` (a ``LambdaLR``), e.g. Posch & Pilz's
        ``lambda i: (1 + 1e-4 * i) ** -0.75``.
    lr_multipliers : mapping, optional
        ``fnmatch`` pattern over guide parameter names -> learning-rate factor, e.g.
        ``{"*.gamma*": 50.0}`` for the correlation parameters of the tridiagonal family
        (names look like ``sites.fc1.weight.gamma_unconstrained``).
    num_particles : int, default 1
        ELBO samples per step, vectorised into one batched pass.
    kl_weight : float or callable, default 1.0
        Factor on the prior-minus-guide (KL) part of the ELBO, or ``step -> factor`` for
        annealing. ``1`` is the true ELBO.
    elbo : {"trace", "meanfield"}
        ``Trace_ELBO`` (Monte Carlo KL) or ``TraceMeanField_ELBO`` (closed-form KL where one is
        registered, which holds for every family here against Normal priors).
    guide_options : mapping, optional
        Passed to the guide class when ``guide`` is a name or a class.
    device : "auto", "cpu", "cuda" or torch.device
        ``"auto"`` uses CUDA when available. Model, data and guide all move there.
    seed : int or None, default 0
        Seeds Pyro, torch and the shuffling; ``None`` leaves the global RNG alone.
    progress : bool, default True
        Show a tqdm progress bar.
    callbacks : iterable of callables
        Called as ``cb(FitState)`` after every step; a truthy return stops the fit.
    on_divergence : {"raise", "skip"}
        On a NaN/inf loss or gradient the guide goes back to parameters whose loss and
        gradients were finite (an in-memory copy taken every ``LAST_GOOD_EVERY`` = 10 steps;
        the message names the step), then: raise
        :class:`FitDivergedError`, or skip the step and go on from there (a warning at the end
        counts the skipped steps; ``MAX_CONSECUTIVE_SKIPS`` in a row raise). The last update,
        which no step evaluates, is checked by one more loss evaluation after the loop (its
        random draws do not change the RNG state a checkpoint or the caller sees).
    clip_grad_norm : float, optional
        Clip the global gradient norm to this value.
    per_example : bool, default False
        Optimise ``-ELBO / N`` instead of ``-ELBO`` (the same optimum; gradients N times
        smaller). Use it with SGD learning rates quoted for per-example losses, as in most
        papers; Adam is insensitive to the scale. Reported losses stay ``-ELBO``.
    estimator : {"reparam", "local", "flipout"}
        How layers see the weight posterior (see :mod:`zoo.estimators`): one shared weight draw
        per step; local reparameterisation (pre-activations sampled per example: diagonal and
        matrix-normal linear layers); or Flipout (sign-decorrelated draws per example: diagonal
        linear and convolution layers). Sites out of reach keep ``"reparam"``; the served sites
        are listed in ``result.options["estimator_sites"]``. Needs ``num_particles=1``.
    checkpoint : path, optional
        Write a checkpoint (guide, optimiser, schedule, RNG states, position in the data) here,
        atomically, every ``checkpoint_every`` steps (default: at the end of every epoch), at
        the end, and on Ctrl-C.
    checkpoint_every : int, optional
        Steps between checkpoints.
    resume : path, optional
        Continue from a checkpoint written by a fit with the same arguments. With in-memory data
        on the CPU the resumed fit ends with the same parameters as an uninterrupted one.
        Ctrl-C during a fit returns the partial result (``result.interrupted`` is True).

    Returns
    -------
    FitResult
    """
    _check_positive(epochs=epochs, batch_size=batch_size, lr=lr, num_particles=num_particles)
    if num_steps is not None:
        _check_positive(num_steps=num_steps)
    if elbo not in ("trace", "meanfield"):
        raise ValueError(f"elbo must be 'trace' or 'meanfield', got {elbo!r}")
    if on_divergence not in ("raise", "skip"):
        raise ValueError(f"on_divergence must be 'raise' or 'skip', got {on_divergence!r}")
    estimators.check_estimator(estimator)
    if estimator != "reparam" and num_particles != 1:
        raise ValueError(
            f"estimator={estimator!r} draws independent noise per example already; use "
            "num_particles=1 (or estimator='reparam' with several particles)"
        )
    if isinstance(optimizer, str) and optimizer not in _OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {sorted(_OPTIMIZERS)} or a torch optimizer")
    guide_cls = guide_registry.get(guide) if isinstance(guide, str) else None

    dev = _resolve_device(device)
    if isinstance(model, torch.nn.Module):
        model.to(dev)
    tensors = as_tensors(data)
    if tensors is not None:
        check_data(model, *tensors)
    if seed is not None:
        pyro.set_rng_seed(seed)
    generator = torch.Generator()
    generator.manual_seed(seed if seed is not None else int(torch.randint(2**31, ())))
    batches = Batches(data, batch_size, dev, generator)
    if len(batches) == 0:
        raise ValueError("the data set is empty: fit needs at least one example")
    x0, y0 = batches.first()
    if tensors is None and isinstance(model, BayesianModel) and model.task == "classification":
        check_labels(y0, model.out_features)
    check_input_shape(model, x0, y0)

    # Read on the CPU: RNG states must stay CPU tensors (guide.to and the optimiser move the rest)
    resumed = persist.read(resume, "checkpoint", map_location="cpu") if resume else None
    if resumed is not None:
        guide = resumed["guide"]
        persist.attach(guide, model)
    else:
        guide = _build_guide(guide, guide_cls, model, dict(guide_options or {}))
    guide.to(dev)
    if resumed is None:
        with torch.no_grad():
            guide(x0, y0)  # creates the parameters (the prototype trace)
    served, skip_sampling = frozenset(), frozenset()
    if estimator != "reparam":
        served, skip_sampling = estimators.plan(model, guide, estimator, elbo, x0, y0)
        if not served:
            raise ValueError(
                f"estimator={estimator!r} serves no weight of this guide: 'local' needs diagonal "
                "or matrix-normal posteriors on linear layers, 'flipout' diagonal posteriors on "
                "linear or convolution layers. Use estimator='reparam', or guides.AutoMixed to "
                "give those layers such a family."
            )
    params = _param_groups(guide, model, lr, lr_multipliers)
    opt_cls = _OPTIMIZERS[optimizer] if isinstance(optimizer, str) else optimizer
    opt = _make_optimizer(opt_cls, params, lr, dict(optimizer_options or {}))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_schedule) if lr_schedule else None
    all_params = [p for g in params for p in g["params"]]
    _check_finite_parameters(guide, model)
    last_good = _LastGood(all_params, LAST_GOOD_EVERY)

    max_plate_nesting = 1 if isinstance(model, BayesianModel) else float("inf")
    elbo_cls = Trace_ELBO if elbo == "trace" else TraceMeanField_ELBO
    loss_fn = elbo_cls(
        num_particles=num_particles,
        vectorize_particles=num_particles > 1,
        max_plate_nesting=max_plate_nesting,
    ).differentiable_loss
    scale = ElboScale()
    scaled_model, scaled_guide = estimators.wire(
        scale(model), scale(guide), estimator, skip_sampling
    )

    total = num_steps if num_steps is not None else epochs * batches.steps_per_epoch
    result = FitResult(
        model=model,
        guide=guide,
        device=dev,
        options=dict(
            guide=getattr(guide_cls, "__name__", type(guide).__name__),
            epochs=epochs,
            num_steps=total,
            batch_size=batches.batch_size,
            lr=lr,
            num_particles=num_particles,
            kl_weight=kl_weight if not callable(kl_weight) else "schedule",
            per_example=per_example,
            elbo=elbo,
            estimator=estimator,
            estimator_sites=sorted(served),
            seed=seed,
        ),
    )
    # Where the loop stands: step count, epoch, the shuffling generator's state at the start
    # of the epoch and how many batches of the epoch are done. A checkpoint stores exactly this.
    step, epoch, done_in_epoch, epoch_losses = 0, 0, 0, []
    epoch_start_state = generator.get_state()
    elapsed = 0.0
    if resumed is not None:
        opt.load_state_dict(resumed["optimizer"])
        if sched is not None and resumed["scheduler"] is not None:
            sched.load_state_dict(resumed["scheduler"])
        result.losses = list(resumed["losses"])
        result.epoch_losses = list(resumed["epoch_losses"])
        result.skipped_steps = list(resumed.get("skipped_steps", []))
        step, epoch = resumed["step"], resumed["epoch"]
        done_in_epoch, epoch_losses = resumed["done_in_epoch"], list(resumed["epoch_partial"])
        epoch_start_state = resumed["epoch_start_state"]
        elapsed = resumed["wall_time"]
        persist.set_rng_state(resumed["rng"], generator)
    if checkpoint is not None and checkpoint_every is not None:
        _check_positive(checkpoint_every=checkpoint_every)

    def save_checkpoint():
        persist.atomic_save(
            {
                "format": persist.FORMAT,
                "version": persist.VERSION,
                "kind": "checkpoint",
                "guide": guide,
                "optimizer": opt.state_dict(),
                "scheduler": sched.state_dict() if sched is not None else None,
                "rng": persist.rng_state(generator),
                "epoch_start_state": epoch_start_state,
                "step": step,
                "epoch": epoch,
                "done_in_epoch": done_in_epoch,
                "epoch_partial": list(epoch_losses),
                "losses": list(result.losses),
                "epoch_losses": list(result.epoch_losses),
                "skipped_steps": list(result.skipped_steps),
                "wall_time": elapsed + time.perf_counter() - start,
                "options": result.options,
            },
            checkpoint,
        )

    callbacks = list(callbacks)
    bar = tqdm(total=total, initial=step, disable=not progress, unit="step", dynamic_ncols=True)
    start = time.perf_counter()
    stop = False
    skips_in_a_row = 0
    last_batch = None
    try:
        while step < total and not stop:
            # Resuming mid-epoch replays the epoch's shuffle and skips the batches done.
            generator.set_state(epoch_start_state)
            for index, (xb, yb) in enumerate(batches.epoch()):
                if index < done_in_epoch:
                    continue
                last_batch = (xb, yb)
                scale.data_scale = len(batches) / xb.shape[0]
                scale.kl_weight = kl_weight(step) if callable(kl_weight) else kl_weight
                opt.zero_grad(set_to_none=True)
                with _loss_context(validate=step == 0):
                    loss = loss_fn(scaled_model, scaled_guide, xb, yb)
                    (loss / len(batches) if per_example else loss).backward()
                if clip_grad_norm is not None:
                    grad_norm = torch.nn.utils.clip_grad_norm_(all_params, clip_grad_norm)
                else:  # the norm only, to detect a non-finite gradient
                    grads = [p.grad for p in all_params if p.grad is not None]
                    grad_norm = torch.nn.utils.get_total_norm(grads)
                value, finite_grad = torch.stack([loss.detach(), grad_norm]).tolist()
                finite = math.isfinite(value) and math.isfinite(finite_grad)
                if not finite:
                    message = _divergence_message(step, epoch, value, guide, last_good.step)
                    last_good.restore()
                    if on_divergence == "raise":
                        raise FitDivergedError(message, result)
                    result.skipped_steps.append(step)
                    skips_in_a_row += 1
                    if skips_in_a_row >= MAX_CONSECUTIVE_SKIPS:
                        raise FitDivergedError(
                            f"{skips_in_a_row} steps in a row had a non-finite loss or gradient "
                            f"(on_divergence='skip' gives up); the last: {message}",
                            result,
                        )
                else:
                    skips_in_a_row = 0
                    last_good.offer(step)
                    opt.step()
                    if sched is not None:
                        sched.step()
                    result.losses.append(value)
                    epoch_losses.append(value)
                step += 1
                done_in_epoch = index + 1
                bar.update(1)
                if step % 10 == 0 or step == total:
                    bar.set_postfix(epoch=epoch, loss=f"{value:.4g}", refresh=False)
                epoch_end = done_in_epoch == batches.steps_per_epoch
                state = FitState(step, epoch, value, epoch_end or step == total, result)
                if epoch_end:
                    if epoch_losses:
                        result.epoch_losses.append(sum(epoch_losses) / len(epoch_losses))
                    epoch, done_in_epoch, epoch_losses = epoch + 1, 0, []
                    epoch_start_state = generator.get_state()
                if checkpoint is not None and (
                    (checkpoint_every is not None and step % checkpoint_every == 0)
                    or (checkpoint_every is None and epoch_end)
                ):
                    save_checkpoint()
                if any(cb(state) for cb in callbacks):
                    stop = True
                if stop or step >= total:
                    break
    except KeyboardInterrupt:
        result.interrupted = True
        if checkpoint is not None:
            save_checkpoint()
    finally:
        bar.close()
        result.wall_time = elapsed + time.perf_counter() - start
    if last_batch is not None and not result.interrupted and last_good.step is not None:
        # The last update is not checked by any step: check it here, invisibly to the RNG.
        rng = persist.rng_state(generator)
        with torch.no_grad(), _loss_context(validate=False):
            final = float(loss_fn(scaled_model, scaled_guide, *last_batch))
        persist.set_rng_state(rng, generator)
        if not math.isfinite(final):
            message = (
                f"the parameters after the last update (step {step - 1}) give a non-finite "
                f"loss ({final}). {_restored(last_good.step)}"
            )
            last_good.restore()
            if on_divergence == "raise":
                raise FitDivergedError(message, result)
            warnings.warn(message, RuntimeWarning, stacklevel=2)
    if checkpoint is not None and not result.interrupted:
        save_checkpoint()
    if result.skipped_steps:
        warnings.warn(
            f"{len(result.skipped_steps)} of {step} steps were skipped for a non-finite loss or "
            f"gradient (the first at step {result.skipped_steps[0]}; all in "
            "result.skipped_steps). Consider a smaller lr or clip_grad_norm.",
            RuntimeWarning,
            stacklevel=2,
        )
    return result


class _LastGood:
    """A copy of the parameters whose loss and gradients were finite, taken before the update
    of every ``every``-th finite step and restored when a step is not finite, so that a diverged
    fit never leaves the guide at parameters that give a non-finite loss (an update can leave
    finite parameters whose next loss is NaN). Copying every step would cost a read and a write
    of all parameters per step (0.2 ms of a 12 ms diagonal MLP step on the CPU, 1.3 ms of the
    low-rank one); every tenth costs a tenth of that."""

    def __init__(self, params: list[torch.Tensor], every: int):
        self.params = [p.detach() for p in params]  # views: optimisers update in place
        self.every = every
        self.copies = [torch.empty_like(p) for p in params]
        self.step: int | None = None
        self.offers = 0

    @torch.no_grad()
    def offer(self, step: int) -> None:
        """Called with the parameters of a finite step, before its update."""
        if self.offers % self.every == 0:
            torch._foreach_copy_(self.copies, self.params)
            self.step = step
        self.offers += 1

    @torch.no_grad()
    def restore(self) -> None:
        if self.step is not None:
            torch._foreach_copy_(self.params, self.copies)


def _check_positive(**values) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{name} must be a positive number, got {value!r}")
        if name in ("epochs", "batch_size", "num_particles", "num_steps") and value != int(value):
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _resolve_device(device) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _build_guide(guide, guide_cls, model, options) -> AutoGuide:
    if guide_cls is not None:
        return guide_cls(model, **options)
    if isinstance(guide, AutoGuide):
        if options:
            raise ValueError("guide_options apply only when guide is a name or a class")
        return guide
    if inspect.isclass(guide):
        return guide(model, **options)
    if callable(guide):
        built = guide(model, **options)
        if not isinstance(built, torch.nn.Module):
            raise TypeError("a guide factory must return a torch.nn.Module guide")
        return built
    raise TypeError(
        f"guide must be a family name {guide_registry.available()}, an AutoGuide class, a "
        f"callable model -> guide, or a guide instance; got {type(guide).__name__}"
    )


def _make_optimizer(opt_cls, params, lr, options) -> torch.optim.Optimizer:
    """The built-in optimisers run fused (one kernel per step for all tensors, on the CPU as on
    CUDA: several times faster than the per-tensor loop on large models), else ``foreach``.
    An explicit ``fused`` or ``foreach`` in ``optimizer_options`` wins."""
    if opt_cls not in _OPTIMIZERS.values() or "fused" in options or "foreach" in options:
        return opt_cls(params, lr=lr, **options)
    try:
        return opt_cls(params, lr=lr, fused=True, **options)
    except (RuntimeError, ValueError, TypeError):  # a dtype or device without a fused kernel
        return opt_cls(params, lr=lr, foreach=True, **options)


def _named_parameters(guide, model) -> list[tuple[str, torch.Tensor]]:
    """The guide's parameters and the model's own (``model.``-prefixed), as fit sees them."""
    named = list(guide.named_parameters())
    if isinstance(model, torch.nn.Module):
        named += [(f"model.{n}", p) for n, p in model.named_parameters()]
    return named


def _param_groups(guide, model, lr, multipliers) -> list[dict]:
    named = [(n, p) for n, p in _named_parameters(guide, model) if p.requires_grad]
    if not named:
        raise ValueError("the guide has no parameters to optimise")
    multipliers = dict(multipliers or {})
    groups: dict[float, list] = {}
    used = set()
    for name, p in named:
        factor = 1.0
        for pattern, value in multipliers.items():
            if fnmatch.fnmatchcase(name, pattern):
                factor = float(value)
                used.add(pattern)
                break
        groups.setdefault(factor, []).append(p)
    unused = set(multipliers) - used
    if unused:
        examples = [n for n, _ in named[:4]]
        raise ValueError(
            f"lr_multipliers patterns {sorted(unused)} match no parameter; names look like "
            f"{examples}"
        )
    return [{"params": ps, "lr": lr * f} for f, ps in groups.items()]


def _check_finite_parameters(guide, model) -> None:
    named = _named_parameters(guide, model)
    bad = [n.removesuffix("_unconstrained") for n, p in named if not torch.isfinite(p).all()]
    if bad:
        raise ValueError(
            f"the parameters {bad} hold NaN or infinite values before training; a guide from a "
            "diverged fit or a bad initialisation cannot be fitted further: build a new guide "
            "(or load an earlier checkpoint)"
        )


def _divergence_message(step: int, epoch: int, value: float, guide, good: int | None) -> str:
    bad = sorted(
        {
            name.rsplit(".", 1)[0].removeprefix("sites.")
            for name, p in guide.named_parameters()
            if p.grad is not None and not torch.isfinite(p.grad).all()
        }
    )
    where = f"; non-finite gradients at sites {bad}" if bad else ""
    return (
        f"the fit diverged at step {step} (epoch {epoch}): loss = {value}{where}. {_restored(good)}"
    )


def _restored(good: int | None) -> str:
    """Where a diverged fit leaves the guide, and what to try."""
    if good is None:
        return (
            "The parameters the fit started from already give it (no finite step yet); check "
            "the data, the priors and init_scale."
        )
    return (
        f"The guide is back at the parameters of step {good}, which gave a finite loss and "
        f"gradients (a copy is kept every {LAST_GOOD_EVERY} steps). Try a smaller lr, "
        "clip_grad_norm, a smaller init_scale, or on_divergence='skip'."
    )


@contextlib.contextmanager
def _loss_context(validate: bool):
    """How zoo.fit evaluates a loss: Pyro's validation only when asked (the first step), site
    parameters read directly, and no NaN warnings (non-finite losses get a clearer error)."""
    with pyro.validation_enabled(validate), direct_parameters(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Encountered NaN")
        yield


def load(
    path: str | os.PathLike, model: Callable | None = None, map_location: str = "cpu"
) -> FitResult:
    """Load a fit written by :meth:`FitResult.save`, on ``map_location`` (CPU by default).

    Parameters
    ----------
    path : path
        The file.
    model : callable, optional
        Attach the guide to this model instead of the saved one; its sample sites must have the
        names and shapes the guide was fitted to, else a ``ValueError`` says which differ.
    map_location : str or torch.device
        Where tensors go; a fit saved on CUDA loads on the CPU by default.
    """
    payload = persist.read(path, "fit", map_location=map_location)
    model = payload["model"] if model is None else model
    if isinstance(model, torch.nn.Module):
        model.to(map_location)
    guide = payload["guide"]
    guide.to(map_location)
    persist.attach(guide, model)
    return FitResult(
        model=model,
        guide=guide,
        losses=list(payload["losses"]),
        epoch_losses=list(payload["epoch_losses"]),
        skipped_steps=list(payload.get("skipped_steps", [])),
        wall_time=payload["wall_time"],
        device=torch.device(map_location),
        options=dict(payload["options"]),
    )
