"""The optimiser of a fit: parameter groups by name pattern, fused built-in optimisers and the
learning-rate schedule."""

from __future__ import annotations

import fnmatch
import inspect
import math
from collections.abc import Callable, Mapping

import torch

from guides.pairs import mean_scale_pairs
from zoo.arguments import check_factor
from zoo.inference.objective import named_parameters

OPTIMIZERS = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}


def check_optimizer(optimizer: str | type) -> type:
    """The optimiser class for a name in :data:`OPTIMIZERS` or a class."""
    if isinstance(optimizer, str):
        if optimizer not in OPTIMIZERS:
            raise ValueError(
                f"optimizer must be one of {sorted(OPTIMIZERS)} or a torch optimizer class"
            )
        return OPTIMIZERS[optimizer]
    return optimizer


def param_groups(guide, model, lr: float, multipliers: Mapping[str, float] | None) -> list[dict]:
    """One parameter group per learning-rate factor: ``multipliers`` maps ``fnmatch`` patterns
    over parameter names (``sites.fc1.weight.gamma_unconstrained``, ``model.<name>``) to factors
    of ``lr``; the first matching pattern wins. A pattern that matches nothing is an error.

    Each group holds ``(name, parameter)`` pairs, which torch's optimisers keep as the group's
    ``"param_names"``, and its factor as ``"lr_factor"`` (its ``"lr"`` is ``lr * lr_factor``;
    :func:`set_rate` is what changes it)."""
    named = [(n, p) for n, p in named_parameters(guide, model) if p.requires_grad]
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
        groups.setdefault(factor, []).append((name, p))
    unused = set(multipliers) - used
    if unused:
        examples = [n for n, _ in named[:4]]
        raise ValueError(
            f"lr_multipliers patterns {sorted(unused)} match no parameter; names look like "
            f"{examples}"
        )
    return [{"params": ps, "lr": lr * f, "lr_factor": f} for f, ps in groups.items()]


def write_rate(group: dict, value: float) -> None:
    """Set one parameter group's ``lr`` to ``value``: every write of a rate goes through here
    (a tensor ``lr``, a CUDA-graph step's, is filled in place)."""
    if torch.is_tensor(group["lr"]):
        group["lr"].fill_(value)
    else:
        group["lr"] = value


def set_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Put ``optimizer`` at the base rate ``lr``: each group at ``lr`` times its ``lr_factor``
    (:func:`param_groups`; a group without one, from an optimiser state saved before groups
    kept it, at ``lr``)."""
    for group in optimizer.param_groups:
        write_rate(group, lr * group.get("lr_factor", 1.0))


def takes_pairs(opt_cls: type) -> bool:
    """Whether ``opt_cls``'s constructor takes ``pairs``: the (mean, scale) pairs of the
    posterior (:func:`guides.mean_scale_pairs`), the protocol by which an optimiser sees them."""
    try:
        return "pairs" in inspect.signature(opt_cls).parameters
    except (TypeError, ValueError):  # no signature to read
        return False


def make_optimizer(opt_cls: type, groups: list[dict], lr: float, options: Mapping, pairs=None):
    """The built-in optimisers run fused (one kernel per step for all tensors, on the CPU as on
    CUDA), else ``foreach``. An explicit ``fused`` or ``foreach`` in ``options`` wins. A class
    whose constructor takes ``pairs`` (:func:`takes_pairs`) gets ``pairs``, the guide's
    :class:`guides.MeanScale` list."""
    options = dict(options)
    if "pairs" in options:
        raise ValueError(
            "optimizer_options may not hold 'pairs': the fit passes the posterior's (mean, "
            "scale) pairs itself to an optimizer whose constructor takes them"
        )
    if takes_pairs(opt_cls):
        options["pairs"] = list(pairs or [])
    try:
        if opt_cls not in OPTIMIZERS.values() or "fused" in options or "foreach" in options:
            return opt_cls(groups, lr=lr, **options)
        try:
            return opt_cls(groups, lr=lr, fused=True, **options)
        except (RuntimeError, ValueError, TypeError):  # a dtype or device without a fused kernel
            return opt_cls(groups, lr=lr, foreach=True, **options)
    except (RuntimeError, ValueError, TypeError, KeyError) as err:
        shown = {k: v for k, v in options.items() if k != "pairs"}
        raise ValueError(
            f"{opt_cls.__name__} refused optimizer_options={shown} "
            f"({type(err).__name__}: {err}); pass only its own arguments, with valid values"
        ) from None


def optimizer_at(lr: float, objective, optim) -> torch.optim.Optimizer:
    """A fit's optimiser (``optim``: its ``zoo.Optim``) over ``objective``'s guide and model
    parameters at ``lr`` (times each group's ``lr_multipliers`` factor)."""
    groups = param_groups(objective.guide, objective.model, lr, optim.lr_multipliers)
    opt_cls = check_optimizer(optim.optimizer)
    pairs = mean_scale_pairs(objective.guide) if takes_pairs(opt_cls) else None
    return make_optimizer(opt_cls, groups, lr, optim.optimizer_options or {}, pairs)


def _exponential(total: int) -> Callable[[int], float]:
    return lambda step: 0.1 ** (step / total)


def _cosine(total: int) -> Callable[[int], float]:
    return lambda step: 0.01 + 0.99 * 0.5 * (1 + math.cos(math.pi * min(step / total, 1.0)))


#: Named learning-rate schedules over a run of ``total`` steps: ``name -> (total -> factor(step))``.
#: ``"exponential"``: ``0.1 ** (step / total)``, a tenfold decay; ``"cosine"``: half a cosine
#: from 1 down to 0.01.
SCHEDULES: dict[str, Callable[[int], Callable[[int], float]]] = {
    "exponential": _exponential,
    "cosine": _cosine,
}


def resolve_schedule(
    lr_schedule: Callable[[int], float] | str | None, total: int
) -> Callable[[int], float] | None:
    """``step -> factor`` for a callable, a name in :data:`SCHEDULES` (over ``total`` steps) or
    ``None``."""
    if lr_schedule is None or callable(lr_schedule):
        return lr_schedule
    if lr_schedule not in SCHEDULES:
        raise ValueError(
            f"lr_schedule must be a callable or one of {sorted(SCHEDULES)}, got {lr_schedule!r}"
        )
    return SCHEDULES[lr_schedule](max(int(total), 1))


def make_scheduler(optimizer, lr_schedule, total: int = 1, cuts=None):
    """A ``LambdaLR`` multiplying every group's ``lr`` by the schedule's factor at each step
    (:func:`resolve_schedule`), times ``cuts.lr_factor(step)`` when ``cuts`` is given (the
    rate cuts of a convergence rule, :class:`zoo.training.convergence.ConvergenceTracker`), or
    ``None`` when neither is."""
    factor = resolve_schedule(lr_schedule, total)
    if factor is not None:
        check_factor("lr_schedule", factor, sorted({0, max(int(total) - 1, 0)}))
        if callable(lr_schedule):  # a user's: every step's factor checked as it comes
            factor = _checked(factor)
    if cuts is not None:
        factor = _times(factor, cuts.lr_factor)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor) if factor else None


def _checked(schedule: Callable[[int], float]) -> Callable[[int], float]:
    """``schedule`` whose every factor is checked when it is used: a value that is not a
    finite number >= 0 stops the fit at that step, named (a negative factor climbs the loss;
    ``None`` or a string is no factor), before the optimiser takes it."""

    def factor(step: int) -> float:
        value = schedule(step)
        if torch.is_tensor(value) and value.numel() == 1:
            value = value.item()
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or not math.isfinite(value) or value < 0:
            raise ValueError(
                f"lr_schedule gave {value!r} at step {step}: it must return a finite number "
                ">= 0 at every step (a negative factor turns the step round: it climbs the "
                "loss); the fit stopped before taking it"
            )
        return value

    return factor


def _times(schedule: Callable[[int], float] | None, cut: Callable[[int], float]):
    if schedule is None:
        return cut
    return lambda step: schedule(step) * cut(step)


def apply_factor(scheduler) -> None:
    """Set every group's ``lr`` to what ``scheduler`` (a ``LambdaLR``) gives at its current
    step, now rather than at its next ``step()`` (a factor has changed in between); a tensor
    ``lr`` (a CUDA-graph step's) is filled in place."""
    step = scheduler.last_epoch
    for group, base, fn in zip(
        scheduler.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas
    ):
        write_rate(group, base * fn(step))


def check_finite_parameters(guide, model) -> None:
    """Refuse a guide (or model) whose parameters already hold NaN or infinite values."""
    named = named_parameters(guide, model)
    bad = [n.removesuffix("_unconstrained") for n, p in named if not torch.isfinite(p).all()]
    if bad:
        raise ValueError(
            f"the parameters {bad} hold NaN or infinite values before training; a guide from a "
            "diverged fit or a bad initialisation cannot be fitted further: build a new guide "
            "(or load an earlier checkpoint)"
        )


def grad_norm(params: list[torch.Tensor], clip: float | None = None) -> torch.Tensor:
    """The global norm of the gradients in ``.grad`` (a 0-d tensor, before clipping), the
    gradients clipped to ``clip`` if given; no host read, so it also runs inside a CUDA graph.
    A fit tests it for a non-finite gradient."""
    if clip is not None:
        return torch.nn.utils.clip_grad_norm_(params, clip)
    return torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
