"""The whole step as one CUDA graph (``zoo.Engine(cuda_graph="auto")``, the default: on CUDA
whenever the fit allows it).

With the compiled loss (:mod:`zoo.inference.compiled`) the Python of Pyro's traces is gone, but
every step still launches each of its kernels from the host: the forward pass, the backward pass,
the gradient norm, the fused optimiser. On a GPU these launches, not the arithmetic, bound the step
of a small network. :class:`GraphedStep` records the stepper's body (:mod:`zoo.training.step`)
once with ``torch.cuda.graph`` and replays the recording: one launch per step.

What the graph holds, and what stays outside:

- **Inputs** are static buffers: each step's minibatches are copied into the buffers the graph
  reads, and the two scales of :mod:`zoo.inference.elbo` (``N / B`` and the KL weight) are 0-d
  tensors filled before each replay, so a KL schedule needs no new graph. The learning rates become
  0-d tensors in the optimiser's groups, which the schedule fills in place.
- **Random numbers**: the graph draws from torch's CUDA generator, whose offset advances with
  every replay (torch registers it with the graph), so every step draws afresh, as eagerly.
- **Divergence**: the body marks the fused optimiser's skip flag on the device; the host reads
  the results every ``check_every`` steps (:mod:`zoo.training.divergence`).
- **Outside the graph**: steps of another shape (the last of an epoch when ``B`` does not divide
  ``N``) run the same body eagerly, as do the first step (Pyro's validation) and the
  ``WARMUP_STEPS`` steps before the capture, which run on a side stream as CUDA graphs require.
  Every call is one real optimiser step: capturing a step does not run it, so the capture is
  followed by its first replay.
- **The first replay is checked**: the step is replayed, then undone (parameters, optimiser
  state and random generators restored in place) and taken eagerly from the same state; the
  graph is kept only if the two losses and updated parameters agree within
  ``zoo.inference.compiled.CHECK_RTOL``. Either way the eager step is the one that counts.
- **A failed capture or check** (an operation a CUDA graph cannot hold, a replay that computes
  another step) does not stop the fit: it warns once, names the cause in
  ``result.options["cuda_graph"]``, takes the step eagerly, and runs every later step eagerly
  (with the compiled loss). On the CPU both are tested with an emulated capture
  (``tests/zoo/test_graphed.py``), and on a GPU by ``tests/zoo/test_cuda.py``.

:mod:`zoo.training.rules` decides when a fit may use it (CUDA, one process, the compiled loss, a
fused optimiser).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import torch

from zoo.inference.compiled import CHECK_RTOL
from zoo.inference.objective import Objective
from zoo.runtime.rng import forked
from zoo.runtime.torch_private import copy_tensors

#: Eager steps on a side stream before the capture (the TorchScript executor profiles and
#: optimises a graph on its first runs, and the optimiser creates its state on the first).
WARMUP_STEPS = 3


class GraphedStep:
    """The static inputs and the recording of one step of the engine (see the module's notes).

    Parameters
    ----------
    objective : Objective
        Set up, with its compiled loss.
    optimizer : torch.optim.Optimizer
        Fused Adam, AdamW or SGD; its learning rates become device tensors.
    num_data : int
        ``N``, for the data scale ``N / B``.
    capture : bool, optional
        Record and replay a CUDA graph (default: on a CUDA device). ``False`` runs the same
        body eagerly from the same static buffers (what the tests check on the CPU).
    accumulate : int, default 1
        Minibatches per step (the static buffers hold that many).
    """

    def __init__(
        self,
        objective: Objective,
        optimizer: torch.optim.Optimizer,
        num_data: int,
        capture: bool | None = None,
        accumulate: int = 1,
    ):
        self.objective, self.optimizer, self.num_data = objective, optimizer, num_data
        self.accumulate = int(accumulate)
        if objective.backend is None:
            raise ValueError("the graph step replays the compiled loss: set up the objective first")
        self.backend = objective.backend
        self.params = self.backend.params
        self.device = self.params[0].device
        self.capture = self.device.type == "cuda" if capture is None else capture
        dtype = self.backend.dtype
        self.data_scale = torch.zeros((), dtype=dtype, device=self.device)
        self.kl_weight = torch.zeros((), dtype=dtype, device=self.device)
        self.loss = torch.zeros((), dtype=dtype, device=self.device)
        self.norm = torch.zeros((), dtype=dtype, device=self.device)
        self.inputs: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self.fn: Callable | None = None
        self.graph: torch.cuda.CUDAGraph | None = None
        self.calls = 0
        #: Why the capture failed (``None``: it has not); the steps then run eagerly.
        self.failed: str | None = None
        for group in optimizer.param_groups:  # rates the schedule fills in place
            lr = group["lr"]
            lr = lr.detach() if torch.is_tensor(lr) else torch.tensor(float(lr))
            group["lr"] = lr.to(device=self.device, dtype=torch.float32)
            if self.capture:
                group["capturable"] = True

    def accepts(self, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> bool:
        """Whether a step's minibatches fit the static buffers, and the compiled loss has a
        graph for them; otherwise the engine steps eagerly. The first full step seen sets the
        buffers: ``accumulate`` minibatches of the fit's minibatch size, never the smaller last
        step of an epoch (a resumed fit may start with it)."""
        if self.failed is not None:
            return False
        x, y = batches[0]
        if self.inputs is None:
            full = self.objective.minibatch_size
            if len(batches) < self.accumulate or any(len(a) < full for a, _ in batches):
                return False
            fn = self.backend.function_for(x, y, self.num_data / len(x), 1.0)
            if fn is None:
                return False
            self.fn = fn
            self.inputs = [(torch.empty_like(a), torch.empty_like(b)) for a, b in batches]
        return len(batches) == len(self.inputs) and all(
            _same(a, sa) and _same(b, sb) for (a, b), (sa, sb) in zip(batches, self.inputs)
        )

    def loss_of(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The compiled loss of a static minibatch at the static scales."""
        assert self.fn is not None  # set by accepts()
        return self.fn(*self.params, x, y, self.data_scale, self.kl_weight)

    def step(self, batches, kl_weight: float, body: Callable) -> tuple[torch.Tensor, torch.Tensor]:
        """One real optimiser step on ``batches``: ``body(inputs, loss_of)`` (the engine's,
        which computes the loss, the gradients, the norm, the skip flag and the update) eagerly
        during the warm-up, then captured and replayed. Returns the static ``(loss, norm)``
        (overwritten by the next step: copy what you keep)."""
        assert self.inputs is not None  # set by accepts()
        for (x, y), (sx, sy) in zip(batches, self.inputs):
            sx.copy_(x, non_blocking=True)
            sy.copy_(y, non_blocking=True)
        self.data_scale.fill_(self.num_data / len(batches[0][0]))
        self.kl_weight.fill_(kl_weight)
        run = lambda: self._record_outputs(body)  # noqa: E731
        if not self.capture:
            self.optimizer.zero_grad(set_to_none=True)
            run()
        elif self.graph is not None:
            self.graph.replay()
        elif self.calls < WARMUP_STEPS:
            self._on_side_stream(run)
        else:
            try:
                self._record(run)
            except Exception as error:  # an operation the capture cannot hold
                self._end_failed_capture()  # first: the warning may be raised as an error
                self._give_up(error)
                self.optimizer.zero_grad(set_to_none=True)
                run()  # the step the capture did not take, eagerly
            else:
                self._checked_replay(run)
        self.calls += 1
        return self.loss, self.norm

    def _record(self, run: Callable) -> None:
        """Capture the body (this does not run it); the gradients are allocated inside the
        capture, so every replay writes them at the same addresses."""
        self.optimizer.zero_grad(set_to_none=True)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            run()
        self.graph = graph

    def _end_failed_capture(self) -> None:
        """Leave torch's CUDA generators as a completed capture would. A capture that raises
        ends without its epilogue, so the generator stays marked as capturing and every later
        draw in the process fails ("Offset increment outside graph capture encountered
        unexpectedly"); a capture that completes clears the mark, so one of a single kernel
        is taken and dropped. If even that fails, the warning says so."""
        if self.device.type != "cuda":
            return
        try:
            probe = torch.zeros(1, device=self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                probe.add_(1)
            del graph
        except Exception as error:  # noqa: BLE001 - reported, the fit goes on eagerly
            warnings.warn(
                "after the failed CUDA-graph capture, torch's CUDA generator could not be "
                f"reset ({str(error).splitlines()[0] if str(error) else type(error).__name__}); "
                "random draws on this device may fail for the rest of the process",
                RuntimeWarning,
                stacklevel=5,
            )

    def _checked_replay(self, run: Callable) -> None:
        """The first replay, checked against the same step taken eagerly from the same state
        (parameters, optimiser state, random generators): the graph is kept only if its loss
        and updated parameters match (:data:`CHECK_RTOL`); either way the eager step is the one
        that counts, so the fit goes on from it."""
        saved = self._state()
        assert self.graph is not None  # recorded
        with forked(self.device):  # the eager step below draws what the replay drew
            self.graph.replay()
            replayed = [self.loss.clone(), *(p.detach().clone() for p in self.params)]
        self._restore(saved)
        self.optimizer.zero_grad(set_to_none=False)  # the graph's gradients stay where they are
        run()
        differs = _difference(replayed, [self.loss, *self.params])
        if differs is not None:
            error = RuntimeError(f"the replayed step differs from the eager one: {differs}")
            self._give_up(error, "step failed its check against the eager step")

    def _state(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Copies of every tensor a step updates in place: the parameters and the optimiser's
        state (moments, step counts)."""
        live = [p for group in self.optimizer.param_groups for p in group["params"]]
        for p in list(live):
            live += [v for v in self.optimizer.state.get(p, {}).values() if torch.is_tensor(v)]
        return [(t, t.detach().clone()) for t in live]

    @staticmethod
    def _restore(saved: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        live, copies = zip(*saved)
        with torch.no_grad():  # in place: the graph reads and writes these addresses
            copy_tensors(live, copies)

    def _give_up(self, error: Exception, what: str = "capture of the step failed") -> None:
        """A failed capture or check: this fit's steps run eagerly from here, with one warning
        naming the cause (``result.options["cuda_graph"]`` records it too)."""
        self.failed = str(error).splitlines()[0] if str(error) else type(error).__name__
        self.graph = None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the failed capture's stream is done with
        warnings.warn(
            f"the CUDA-graph {what} ({self.failed}); this fit goes on "
            "with the step run eagerly (engine=zoo.Engine(cuda_graph=False) avoids the attempt)",
            RuntimeWarning,
            stacklevel=6,
        )

    @property
    def state(self) -> bool | str:
        """What ``result.options["cuda_graph"]`` records: ``True``, why the graph gave up, or
        why it was never used (the compiled loss was refused at its check)."""
        if self.failed is not None:
            return f"failed, ran eagerly ({self.failed})"
        if self.fn is None and self.objective.jit_state != "compiled":
            return f"off (the loss ran {self.objective.jit_state})"
        return True

    def _record_outputs(self, body: Callable) -> None:
        loss, norm = body(self.inputs, self.loss_of)
        self.loss.copy_(loss.detach())
        self.norm.copy_(norm)

    def _on_side_stream(self, run: Callable) -> None:
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            self.optimizer.zero_grad(set_to_none=True)
            run()
        torch.cuda.current_stream(self.device).wait_stream(side)

    def zero_grad(self) -> None:
        """Before an eager step between replays: zero the gradients where they are (the graph
        writes and reads them at their captured addresses)."""
        self.optimizer.zero_grad(set_to_none=self.graph is None)


def _difference(replayed: list[torch.Tensor], eager: list[torch.Tensor]) -> str | None:
    """How the replayed step's loss and parameters (``replayed``) differ from the eager
    step's, beyond :data:`CHECK_RTOL` (``None``: they agree)."""
    for index, (a, b) in enumerate(zip(replayed, eager)):
        a, b = a.detach().double(), b.detach().double()
        scale = b.abs().max().clamp_min(1e-12)
        gap = float(((a - b).abs().max() / scale).nan_to_num(nan=math.inf))
        if gap > CHECK_RTOL:
            what = "the loss" if index == 0 else f"parameter {index - 1}"
            return f"{what} by {gap:.2e} of its largest value"
    return None


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.shape, a.dtype) == (b.shape, b.dtype)
