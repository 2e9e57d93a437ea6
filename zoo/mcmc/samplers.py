"""Reference samplers: what :func:`zoo.reference` runs in each chain, each with its own settings.

A sampler is a small frozen object (:class:`Sampler`): it checks its settings before any work,
says them as plain data (recorded in the result's ``options`` and in every chain checkpoint, and
compared on resume), builds a Pyro MCMC kernel on the model (fresh, or at what a warm-up
adapted), reads back what its warm-up adapted, and takes one transition, returning the new
position and the transition's statistics under ArviZ's ``sample_stats`` names. The chain runner
(:mod:`zoo.mcmc.chain`) drives any sampler the same way: warm-up, chunks of draws, a checkpoint
after each, exact resume. :class:`NUTS` (Pyro's No-U-Turn sampler) is the first; a second is one
class here.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from pyro.infer.autoguide.initialization import init_to_sample
from pyro.infer.mcmc import NUTS as PyroNUTS
from pyro.poutine.messenger import Messenger

from zoo.arguments import check_positive, is_number
from zoo.storage import checks as file_checks
from zoo.storage import files


class Sampler(ABC):
    """The interface of a reference sampler (subclass it as a frozen dataclass of settings)."""

    #: The sampler's name in files and ``Reference.options["sampler"]``.
    name: ClassVar[str]
    #: The statistics :meth:`transition` returns per draw (ArviZ ``sample_stats`` names).
    stat_names: ClassVar[tuple[str, ...]]

    @abstractmethod
    def check(self) -> None:
        """Refuse settings no run can use (``ValueError`` naming the setting), before work."""

    def settings(self) -> dict:
        """The settings as plain data, with the sampler's name under ``"sampler"``."""
        return {"sampler": self.name, **asdict(self)}  # type: ignore[call-overload]  # subclasses are dataclasses

    @abstractmethod
    def kernel(self, model: Callable, adapted: dict | None = None) -> Any:
        """A Pyro MCMC kernel on ``model``: adapting during warm-up, or (``adapted``, from
        :meth:`adapted`) at what a warm-up adapted, with adaptation off."""

    @abstractmethod
    def adapted(self, kernel: Any) -> dict:
        """What ``kernel``'s warm-up adapted, as plain data (tensors, numbers, lists)."""

    @abstractmethod
    def restore(self, kernel: Any, adapted: dict) -> None:
        """Put :meth:`adapted`'s values back into a kernel built with them, after its
        ``setup``."""

    @abstractmethod
    def transition(self, kernel: Any, z: dict) -> tuple[dict, dict[str, float]]:
        """One transition from ``z`` (unconstrained): the new position and its statistics."""

    @classmethod
    @abstractmethod
    def check_adapted(cls, state: dict, path: str | os.PathLike) -> None:
        """Refuse a chain file ``state`` (read from ``path``) whose adapted values this sampler
        never writes (``ValueError`` naming the file and the entry)."""


@dataclass(frozen=True)
class NUTS(Sampler):
    """Pyro's No-U-Turn sampler with a diagonal mass matrix; warm-up adapts the step size (dual
    averaging) and the mass matrix.

    Attributes
    ----------
    target_accept : float
        The mean acceptance probability the step size is adapted to, in (0, 1).
    max_tree_depth : int
        The cap on trajectory doublings: a transition takes at most ``2^max_tree_depth``
        full-data gradients.
    jit : bool
        Trace the potential energy with TorchScript (Pyro's ``jit_compile``): several times fewer
        microseconds per gradient on small networks.

    Per draw it records ``diverging``, ``tree_depth`` (trajectory doublings), ``step_size``,
    ``energy`` (the Hamiltonian at the start of the transition), ``lp`` (the log joint density
    in the unconstrained space, Jacobian included) and ``acceptance_rate`` (the transition's
    mean Metropolis acceptance).
    """

    target_accept: float = 0.8
    max_tree_depth: int = 10
    jit: bool = True

    name: ClassVar[str] = "nuts"
    stat_names: ClassVar[tuple[str, ...]] = (
        "diverging",
        "tree_depth",
        "step_size",
        "energy",
        "lp",
        "acceptance_rate",
    )

    def check(self) -> None:
        """Refuse a ``target_accept`` outside (0, 1) and a ``max_tree_depth`` below 1."""
        check_positive(max_tree_depth=self.max_tree_depth)
        target = self.target_accept
        number = is_number(target)
        if not number or not 0 < target < 1:
            raise ValueError(
                f"target_accept must be a number strictly between 0 and 1 (NUTS' mean "
                f"acceptance target, 0.8 by default), got {target!r}"
            )
        if not isinstance(self.jit, bool):
            raise ValueError(f"jit must be True or False, got {self.jit!r}")

    def kernel(self, model: Callable, adapted: dict | None = None) -> Any:
        """Pyro's NUTS kernel on ``model``."""
        options = {}
        if adapted is not None:
            options = dict(step_size=adapted["step_size"], adapt_step_size=False)
            options["adapt_mass_matrix"] = False
        return PyroNUTS(
            model,
            target_accept_prob=self.target_accept,
            max_tree_depth=self.max_tree_depth,
            jit_compile=self.jit,
            ignore_jit_warnings=True,
            init_strategy=init_to_sample,
            **options,
        )

    def adapted(self, kernel: Any) -> dict:
        """The adapted step size and inverse mass matrix (``[[site names], tensor]`` pairs)."""
        return {
            "step_size": float(kernel.step_size),
            "inverse_mass_matrix": [
                [list(names), value] for names, value in kernel.inverse_mass_matrix.items()
            ],
        }

    def restore(self, kernel: Any, adapted: dict) -> None:
        """Set the inverse mass matrix (the step size went to the kernel's constructor)."""
        kernel.mass_matrix_adapter.inverse_mass_matrix = {
            tuple(names): value for names, value in adapted["inverse_mass_matrix"]
        }

    @classmethod
    def check_adapted(cls, state: dict, path: str | os.PathLike) -> None:
        """A positive step size and ``[[names], finite tensor]`` pairs of inverse mass matrix."""
        files.require(state, ("step_size", "inverse_mass_matrix"), path)
        step = state["step_size"]
        number = is_number(step)
        if not number or not 0 < step < float("inf"):
            raise ValueError(f"{path}: the chain's step size is {step!r}, not a positive number")
        matrix = state["inverse_mass_matrix"]
        if not isinstance(matrix, list) or not all(len(item) == 2 for item in matrix):
            raise ValueError(
                f"{path}: the chain's inverse mass matrix is not [[names, tensor], ...]"
            )
        file_checks.check_tensors({str(n): v for n, v in matrix}, path, "inverse mass matrix")

    def transition(self, kernel: Any, z: dict) -> tuple[dict, dict[str, float]]:
        """One NUTS transition and its statistics: the momentum and the doublings are read
        from the transition's own sample sites (a :class:`_Transition` handler); what Pyro
        keeps of the rest is read by :func:`_pyro_state`."""
        before = _pyro_state(kernel)
        potential = before["potential"]
        if potential is None:  # Pyro's cache was cleared: it recomputes the same value
            potential = kernel.potential_fn(z)
        with _Transition() as seen:
            z = kernel.sample(z)
        after = _pyro_state(kernel)
        kinetic = 0.0
        for value in seen.momentum:  # as Pyro sums it: site by site, then halved
            kinetic = kinetic + value.dot(value)
        n = after["post_warmup"]
        return z, {
            "diverging": float(after["divergences"] > before["divergences"]),
            "tree_depth": float(seen.doublings),
            "step_size": float(kernel.step_size),
            "energy": float(0.5 * kinetic + potential),
            "lp": -float(after["potential"]),
            "acceptance_rate": n * after["mean_accept"] - (n - 1) * before["mean_accept"],
        }


class _Transition(Messenger):
    """Records a NUTS transition's momentum draws (sites ``r_t=...``) and its trajectory
    doublings (one ``direction_t=..._treedepth=...`` site each)."""

    def __init__(self):
        super().__init__()
        self.momentum: list = []
        self.doublings = 0

    def _postprocess_message(self, msg):
        if msg["type"] != "sample":
            return
        if msg["name"].startswith("r_t="):
            self.momentum.append(msg["value"])
        elif msg["name"].startswith("direction_t="):
            self.doublings += 1


def _pyro_state(kernel) -> dict:
    """What Pyro's NUTS keeps and does not expose: the potential energy at its last position,
    its running divergence count and mean acceptance probability, and its transitions after
    warm-up. The one place that reads its private state;
    ``tests/zoo/test_reference.py::test_the_nuts_statistics_read_what_pyro_has`` fails when one
    of them, or the site names :class:`_Transition` reads, changes."""
    return {
        "potential": kernel._potential_energy_last,
        "divergences": len(kernel._divergences),
        "mean_accept": kernel._mean_accept_prob,
        "post_warmup": kernel._t - kernel._warmup_steps,
    }


#: The samplers by name, as files record them.
SAMPLERS: dict[str, type[Sampler]] = {NUTS.name: NUTS}


def check_sampler(sampler) -> Sampler:
    """``sampler`` if it is a :class:`Sampler` with valid settings; a clear error otherwise."""
    if isinstance(sampler, type) and issubclass(sampler, Sampler):
        raise TypeError(f"sampler must be an instance, e.g. zoo.{sampler.__name__}(), not a class")
    if not isinstance(sampler, Sampler):
        raise TypeError(
            f"sampler must be a reference sampler such as zoo.NUTS(target_accept=0.9), "
            f"got {type(sampler).__name__}"
        )
    sampler.check()
    return sampler
