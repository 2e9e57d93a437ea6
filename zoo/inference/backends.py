"""How the objective's loss is evaluated: a backend behind one small interface.

:class:`zoo.Objective` evaluates the surrogate ``-ELBO`` of its wired model and guide
(:mod:`zoo.inference.surrogate`, scaled by :mod:`zoo.inference.elbo`) through a
:class:`LossBackend`. Two implement it:

- :class:`EagerLoss`: Pyro's ELBO run as Python every call (always available; what every other
  backend is checked against and falls back to);
- :class:`zoo.inference.compiled.TracedLoss`: the same loss traced once per minibatch shape by
  TorchScript's tracer and replayed.

A backend returns ``None`` for a call it declines (a graph refused by its check, a loss not
finite yet), and the objective evaluates that call eagerly. The CUDA-graph step
(:mod:`zoo.training.cuda_graph`) captures :meth:`LossBackend.function_for`, a function of tensors
only; the stepper knows nothing else of a backend, so a ``torch.compile`` or
``torch.export`` backend, the day Pyro's handlers run under them without graph breaks
(``benchmarks/compile_backend.py`` at ``323cd6e`` measures that), is one more subclass here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import ClassVar

import torch

from zoo.inference.elbo import ElboScale


class LossBackend(ABC):
    """The interface: the loss of a minibatch ``(x, y)`` at the two scales of
    :mod:`zoo.inference.elbo` (``data_scale = N / B`` and ``kl_weight``).

    Attributes
    ----------
    name : str
        How ``result.options["jit"]`` names the backend when it ran.
    params : list of Tensor
        Every tensor the loss differentiates, the first inputs of :meth:`function_for`'s
        function.
    refused : str or None
        Why the backend declined its last new minibatch shape (``None`` while it declined none).
    """

    name: ClassVar[str]
    params: list[torch.Tensor]
    refused: str | None = None

    @abstractmethod
    def function_for(
        self, x: torch.Tensor, y: torch.Tensor, data_scale: float, kl_weight: float
    ) -> Callable | None:
        """The loss of minibatches shaped like ``(x, y)`` as a function of tensors
        ``(*params, x, y, data_scale, kl_weight)`` (the scales 0-d, of :attr:`dtype`), or
        ``None`` when this backend declines it."""

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the scales a function takes (the parameters')."""
        return self.params[0].dtype if self.params else torch.get_default_dtype()

    def scales(self, x: torch.Tensor, data_scale: float, kl_weight: float):
        """The two scales as 0-d tensors on ``x``'s device, one copy to the device."""
        return torch.tensor([data_scale, kl_weight], dtype=self.dtype, device=x.device).unbind()

    def __call__(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        data_scale: float,
        kl_weight: float,
        leaf: torch.Tensor | None = None,
    ) -> torch.Tensor | None:
        """The loss of ``(x, y)``, or ``None`` when this backend declines it (the caller then
        evaluates it eagerly). ``leaf``: a 0-d tensor of the value ``data_scale`` that the
        function takes in its place (a leaf the caller differentiates,
        :meth:`zoo.Objective.loss_with_data_term`)."""
        function = self.function_for(x, y, data_scale, kl_weight)
        if function is None:
            return None
        scales = self.scales(x, data_scale, kl_weight)
        if leaf is not None:
            scales = (leaf, scales[1])
        try:
            return function(*self.params, x, y, *scales)
        except RuntimeError as err:  # Ctrl-C inside a compiled function's interpreter
            if "KeyboardInterrupt" in str(err):
                raise KeyboardInterrupt from err
            raise


class WiredLoss(LossBackend):
    """What a backend of Pyro's ELBO holds: ``elbo`` (``zoo.inference.surrogate``'s), the wired
    ``model`` and ``guide`` (wrapped in ``scale``, the :class:`~zoo.inference.elbo.ElboScale`
    messenger, and an estimator's handlers), the ``params`` the loss differentiates, and
    ``context``, the context manager an evaluation runs in (``context(validate)``)."""

    def __init__(self, elbo, model, guide, params, scale: ElboScale, context: Callable):
        self.elbo, self.model, self.guide = elbo, model, guide
        self.params, self.scale, self.context = list(params), scale, context

    def surrogate(self, *inputs: torch.Tensor) -> torch.Tensor:
        """The surrogate loss of ``(x, y, data_scale, kl_weight)`` (the last four inputs; the
        parameters before them are read from the modules, by identity): the scales set from
        the inputs, then the ELBO."""
        x, y, data_scale, kl_weight = inputs[-4:]
        self.scale.data_scale, self.scale.kl_weight = data_scale, kl_weight
        with self.context():
            return self.elbo.differentiable_loss(self.model, self.guide, x, y)


class EagerLoss(WiredLoss):
    """Pyro's ELBO (``elbo.differentiable_loss``) on the wired ``model`` and ``guide``, run as
    Python every call."""

    name = "eager"

    def function_for(self, x, y, data_scale, kl_weight) -> Callable:
        """:meth:`surrogate`: it sets the scales from its last two inputs and runs the ELBO."""
        return self.surrogate

    def __call__(self, x, y, data_scale: float | torch.Tensor, kl_weight: float, validate=False):
        """The loss of ``(x, y)``, with Pyro's argument and support checks if ``validate``."""
        self.scale.data_scale, self.scale.kl_weight = data_scale, kl_weight
        with self.context(validate):
            return self.elbo.differentiable_loss(self.model, self.guide, x, y)
