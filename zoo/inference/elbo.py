"""How the ELBO is scaled. This is the one place that decides it.

``zoo.fit`` maximises, per step, a minibatch estimate of

    ELBO = sum_{n=1}^{N} E_q[log p(y_n | x_n, w)] - kl_weight * KL(q(w) || p(w))

For a minibatch of ``B`` of the ``N`` examples, every sample site inside the model's
``pyro.plate("data", B)`` (the likelihood) is scaled by ``N / B``, which makes the estimate
unbiased for the full-data ELBO, whatever the batch size. Every latent site (the weights, in the
model and in the guide alike) is scaled by ``kl_weight``, so with ``Trace_ELBO`` the term
``log p(w) - log q(w)`` and with ``TraceMeanField_ELBO`` the closed-form ``KL(q || p)`` are both
multiplied by it. ``kl_weight = 1`` is the true ELBO; a smaller weight is the "KL down-weighting"
of Posch & Pilz (their ``nu``) or a warm-up.

Reported losses are ``-ELBO`` on that full-data scale (nats for the whole training set).
``zoo.Optim(per_example=True)`` optimises ``-ELBO / N`` instead: the same optimum with the
per-example gradient scale that SGD learning rates in papers assume (Adam does not care).

A step of several minibatches (``zoo.Engine(accumulate=k)``, :mod:`zoo.training.step`) follows
``sum_i (B_i / sum_j B_j) L_i``, each ``L_i`` scaled by ``N / B_i`` as above: every example's
likelihood counts ``N / sum_j B_j`` times, as in one minibatch of all of them. Across processes
each rank's loss is scaled the same way and the gradients are averaged
(:mod:`zoo.runtime.distributed`).
"""

from __future__ import annotations

import torch
from pyro.poutine.messenger import Messenger

DATA_PLATE = "data"


def differentiated(loss, num_data: int, per_example: bool):
    """The loss a step differentiates from ``loss``, a full-data ``-ELBO`` estimate: ``loss``
    itself, or with ``per_example`` (``zoo.Optim(per_example=True)``) ``loss / num_data``, the
    per-example ``-ELBO / N``. Reported losses stay ``-ELBO``."""
    return loss / num_data if per_example else loss


class ElboScale(Messenger):
    """Scale likelihood sites (inside plate ``"data"``) by ``data_scale``, latent sites by
    ``kl_weight``."""

    def __init__(self, data_scale: float = 1.0, kl_weight: float = 1.0):
        super().__init__()
        # floats, or 0-d tensors while a compiled loss reads them as its inputs
        self.data_scale: float | torch.Tensor = float(data_scale)
        self.kl_weight: float | torch.Tensor = float(kl_weight)

    def _process_message(self, msg):
        if msg["type"] != "sample":
            return
        if any(frame.name == DATA_PLATE for frame in msg["cond_indep_stack"]):
            msg["scale"] = _times(self.data_scale, msg["scale"])
        elif not msg["is_observed"]:
            msg["scale"] = _times(self.kl_weight, msg["scale"])


def _times(scale, other):
    """``scale * other``, and ``scale`` itself (no multiplication, the same object) when
    ``other`` is the number one: a traced graph then holds no multiplication by one per site,
    and the sites of one scale share it (:mod:`zoo.inference.surrogate` groups them by it)."""
    if isinstance(other, (int, float)) and other == 1:
        return scale
    return scale * other
