"""The states a learning-rate sweep may leave its fit in (:mod:`zoo.training.rate`): the
start, and the state after each step whose rate may still turn out at most the chosen one,
held on their device within :data:`WARMUP_MEMORY` (:class:`Warmup`)."""

from __future__ import annotations

import copy

import torch

__all__ = ["WARMUP_MEMORY", "Snapshot", "Warmup", "state_bytes"]

#: A sweep holds the states its fit may continue from within this many bytes.
WARMUP_MEMORY = 256 * 2**20


class Warmup:
    """The states of a sweep that its fit may continue from: the start, and the state after
    each step whose rate may still turn out at most the chosen one.

    The chosen rate of a sweep's prefix never falls as the sweep goes on (the smoothed minimum
    and the steepest fall before it only move to later, higher rates, and so does the valley:
    the longest falling run grows a step at a time, each new longest ending later than the
    last), so of the states at or below the prefix's choice only the latest is held: what is
    held is that one and the steps after it. Held states (the parameters, buffers and
    optimiser state, on their device) beyond the start's stay within :data:`WARMUP_MEMORY`; a
    state past it is not taken, and the sweep puts back the latest state held at or before
    the chosen step."""

    def __init__(self, tensors: list[torch.Tensor], optimizer: torch.optim.Optimizer):
        self.tensors, self.optimizer = tensors, optimizer
        self.held: dict[int, Snapshot] = {0: Snapshot(tensors, optimizer)}

    def offer(self, step: int, floor: int) -> None:
        """Hold the state after ``step`` steps, now current; the sweep's prefix chose a rate
        at or above the rates of its first ``floor`` steps (0 when it chose none)."""
        below = [j for j in self.held if j <= floor]
        for j in below:
            if j != max(below):
                del self.held[j]
        held = sum(s.nbytes for j, s in self.held.items() if j)  # the start's copy aside
        if held + state_bytes(self.tensors, self.optimizer.state) <= WARMUP_MEMORY:
            self.held[step] = Snapshot(self.tensors, self.optimizer)

    def put_back(self, step: int) -> int:
        """Put back the latest state held at or before ``step``; returns its step."""
        kept = max(j for j in self.held if j <= step)
        self.held[kept].put_back()
        self.held.clear()
        return kept


class Snapshot:
    """A copy of a sweep's state: tensors (parameters, buffers) and the optimiser's state."""

    def __init__(self, tensors: list[torch.Tensor], optimizer: torch.optim.Optimizer):
        self.tensors, self.optimizer = tensors, optimizer
        self.copies = [t.detach().clone() for t in tensors]
        self.state = _copied(optimizer.state_dict())
        #: The bytes this copy holds (tensors and the optimiser's state tensors).
        self.nbytes = state_bytes(self.copies, self.state["state"])

    @torch.no_grad()
    def put_back(self) -> None:
        """Copy the state back into the tensors and the optimiser."""
        for t, c in zip(self.tensors, self.copies):
            t.copy_(c)
        self.optimizer.load_state_dict(self.state)


def _copied(state_dict: dict) -> dict:
    """A copy of an optimiser's ``state_dict()`` that later steps leave alone: its state's
    tensors cloned (Adam's moments and step count; ``state_dict`` hands out the live ones), its
    other values copied (``param_groups`` are packed anew by ``state_dict`` already). One
    clone per tensor, without ``copy.deepcopy``'s walk of every object."""
    state = {
        index: {k: v.detach().clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v)
                for k, v in per_parameter.items()}
        for index, per_parameter in state_dict["state"].items()
    }  # fmt: skip
    return {**state_dict, "state": state, "param_groups": copy.deepcopy(state_dict["param_groups"])}


def state_bytes(tensors: list[torch.Tensor], optimizer_state) -> int:
    """The bytes of ``tensors`` and of the tensors in ``optimizer_state`` (an optimiser's
    ``state``, per parameter: Adam's moments), what a :class:`Snapshot` of them holds."""
    moments = [v for s in optimizer_state.values() for v in s.values()
               if isinstance(v, torch.Tensor)]  # fmt: skip
    return sum(t.numel() * t.element_size() for t in [*tensors, *moments])
