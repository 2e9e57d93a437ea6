"""A LightningModule for ``lightning.Trainer`` users: the same objective as ``zoo.fit``.

    module = zoo.lightning.BayesianModule(zoo.models.LeNet5(), "diagonal", num_data=60_000)
    trainer = lightning.Trainer(strategy="ddp", devices=2, max_epochs=3,
                                callbacks=[ModelCheckpoint(dirpath="ckpt")])
    trainer.fit(module, train_loader, val_loader)
    fit = module.to_fit_result()          # predict, metrics, plots, ArviZ, save/load

``training_step`` returns the scaled ``-ELBO`` of :class:`zoo.Objective` (the minibatch's
likelihood scaled by ``num_data / B``, see :mod:`zoo.inference.elbo`); under ``strategy="ddp"``
Lightning averages the ranks' gradients, an unbiased estimate of the full-data gradient as in
``zoo.Engine(devices=...)`` (:mod:`zoo.runtime.distributed`). Needs ``lightning`` (the
``distributed`` extra). Lightning's own loop runs the steps: ``zoo.fit``'s divergence guard and
compiled loss are not part of this route; its thread rule is (``threads``, applied from a stage's
first batch to its ``teardown``, the caller's setting restored).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import torch

import guides.registry
from guides.pairs import mean_scale_pairs
from zoo.evaluation.predictive import predict
from zoo.inference.elbo import differentiated
from zoo.inference.objective import Objective
from zoo.models.base import BayesianModel
from zoo.models.statistics import frozen_statistics
from zoo.results.variational import FitResult
from zoo.runtime.distributed import INSTALL_HINT
from zoo.runtime.packages import require_torchvision
from zoo.runtime.rng import seeded
from zoo.runtime.threads import check_threads, threads_for
from zoo.training.keywords import refuses_flat_keywords
from zoo.training.optim import (
    check_optimizer,
    make_optimizer,
    make_scheduler,
    param_groups,
    takes_pairs,
)
from zoo.training.options import Loss, Optim, group

require_torchvision("zoo.lightning (Lightning)")  # before Lightning imports it
try:
    import lightning as L
except ImportError as err:  # pragma: no cover - lightning is in the dev extra
    raise ImportError(f"zoo.lightning needs Lightning: {INSTALL_HINT} ({err})") from None

__all__ = ["BayesianModule"]


class BayesianModule(L.LightningModule):
    """A zoo model and guide as a LightningModule.

    Parameters
    ----------
    model : BayesianModel
        A ``zoo.models`` network (or any zoo model).
    guide : str, guides.family(...), AutoGuide class or instance
        As in ``zoo.fit``.
    num_data : int
        ``N``, the training set's size: the likelihood of a batch of ``B`` is scaled by
        ``N / B``.
    example : (x, y) tensors, optional
        A small batch to create the guide's parameters on (needed before the optimiser is
        built); by default zeros shaped like ``model.input_shape``.
    lr : float, default 1e-3
    optim : zoo.Optim or dict, optional
        As in ``zoo.fit`` (:mod:`zoo.training.options`); a named ``lr_schedule`` runs over
        ``trainer.estimated_stepping_batches``. ``clip_grad_norm`` is Lightning's here: pass
        ``lightning.Trainer(gradient_clip_val=...)``.
    loss : zoo.Loss or dict, optional
        As in ``zoo.fit`` (``kl_weight`` may be ``step -> weight``).
    num_samples : int, default 32
        Weight draws for validation and ``trainer.predict``.
    seed : int, default 0
        Seeds the validation and prediction draws (the same draws on every rank).
    threads : "auto", int or None, default "auto"
        Torch's intra-op CPU threads from the first batch to ``teardown`` of every Trainer
        stage, as ``zoo.fit``'s rule decides them for a forward pass of that batch
        (:mod:`zoo.runtime.threads`: one thread for a small one on the CPU); the caller's setting is
        restored at ``teardown``.

    Notes
    -----
    Logged: ``train/elbo`` (full-data scale), ``train/kl`` (``KL(q || p)`` estimate, every
    ``log_every_n_steps``), and at each validation the model's held-out metrics
    (classification: ``val/accuracy``, ``val/nll``, ``val/brier``, ``val/ece``; regression:
    ``val/rmse``, ``val/nll``, ``val/coverage_95``) computed on the outputs of every rank.
    """

    @functools.partial(refuses_flat_keywords, groups={"optim": Optim, "loss": Loss})
    def __init__(
        self,
        model,
        guide,
        num_data: int,
        *,
        example: tuple[torch.Tensor, torch.Tensor] | None = None,
        lr: float = 1e-3,
        optim: Optim | Mapping | None = None,
        loss: Loss | Mapping | None = None,
        num_samples: int = 32,
        seed: int = 0,
        threads: int | str | None = "auto",
    ):
        super().__init__()
        check_threads(threads)
        optim, loss = group(Optim, optim), group(Loss, loss)
        if optim.clip_grad_norm is not None:
            raise ValueError(
                "BayesianModule leaves clipping to Lightning: pass "
                "lightning.Trainer(gradient_clip_val=..., gradient_clip_algorithm='norm')"
            )
        if int(num_data) < 1:
            raise ValueError(f"num_data must be the training set's size, got {num_data!r}")
        self.model, self.num_data = model, int(num_data)
        self.guide = guides.registry.instantiate(guide, model, {})
        loss = loss.resolved(guides.registry.recipe(self.guide))  # the family's ELBO, estimator
        self.objective = Objective.from_loss(model, self.guide, loss, jit=False)
        with frozen_statistics():  # the guide's set-up traces the model: not a training step
            self.objective.setup(*_example(model, example))
        self.lr, self.optim = lr, optim
        self.per_example, self.num_samples, self.seed = optim.per_example, num_samples, seed
        self.losses: list[float] = []
        self._val: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._draws: dict[str, torch.Tensor] | None = None
        self.threads = threads
        self._threads_before: int | None = None

    # ---- the thread rule, from a stage's first batch to its teardown ------------------------
    def _apply_threads(self, batch) -> None:
        """Torch's thread count for this stage, by ``zoo.fit``'s rule weighed on a forward pass
        of this batch's size (the first batch of the stage; the caller's count is restored at
        ``teardown``)."""
        if self._threads_before is not None:
            return
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        flops = lambda: self.objective.flops_per_example() * len(x)  # noqa: E731
        count = threads_for(self.threads, self.device, flops)
        if count is not None:
            self._threads_before = torch.get_num_threads()
            torch.set_num_threads(count)

    def on_train_batch_start(self, batch, batch_idx: int) -> None:
        self._apply_threads(batch)

    def on_validation_batch_start(self, batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._apply_threads(batch)

    def on_predict_batch_start(self, batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._apply_threads(batch)

    def teardown(self, stage: str) -> None:
        if self._threads_before is not None:
            torch.set_num_threads(self._threads_before)
            self._threads_before = None

    # ---- training ---------------------------------------------------------------------------
    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = self.objective.loss(x, y, self.num_data, step=self.global_step)
        self.losses.append(loss.item())
        self.log("train/elbo", -loss.detach(), prog_bar=True, sync_dist=True)
        every = getattr(self.trainer, "log_every_n_steps", 50)  # the Trainer's argument
        if self.global_step % max(every, 1) == 0:
            self.log("train/kl", self.kl(x, y), sync_dist=True)
        return differentiated(loss, self.num_data, self.per_example)

    def kl(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """A one-draw estimate of ``KL(q || p)`` (:meth:`zoo.Objective.kl`)."""
        return self.objective.kl(x, y)

    def configure_optimizers(self):
        o = self.optim
        groups = param_groups(self.guide, self.model, self.lr, o.lr_multipliers)
        options = dict(o.optimizer_options or {})
        opt_cls = check_optimizer(o.optimizer)
        pairs = mean_scale_pairs(self.guide) if takes_pairs(opt_cls) else None
        opt = make_optimizer(opt_cls, groups, self.lr, options, pairs)
        total = max(int(self.trainer.estimated_stepping_batches), 1)
        sched = make_scheduler(opt, o.lr_schedule, total)
        if sched is None:
            return opt
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    # ---- validation and prediction ----------------------------------------------------------
    def _fixed_draws(self) -> dict[str, torch.Tensor]:
        """``num_samples`` weight draws, the same on every rank (seeded)."""
        with seeded(self.seed, self.device):
            return self.guide.sample_posterior(self.num_samples)

    def on_validation_epoch_start(self) -> None:
        self._draws, self._val = self._fixed_draws(), []

    def validation_step(self, batch, batch_idx: int) -> None:
        x, y = batch
        pred = predict(self.model, self.guide, x, params=self._draws, progress=False)
        self._val.append((pred.outputs, y))

    def on_validation_epoch_end(self) -> None:
        if not self._val:
            return
        outputs = torch.cat([o for o, _ in self._val], dim=1)
        targets = torch.cat([t for _, t in self._val])
        if self.trainer.world_size > 1:  # every rank's outputs (equal shards: the sampler pads)
            outputs = _merge(_all_gather(outputs), dim=1)
            targets = _merge(_all_gather(targets), dim=0)
        pred = self.model.likelihood.predict(outputs, self._draws)
        for name, value in self.model.likelihood.metrics(pred, targets).items():
            self.log(f"val/{name}", value, sync_dist=True)  # the same on every rank
        self._val = []

    def on_predict_epoch_start(self) -> None:
        self._draws = self._fixed_draws()

    def predict_step(self, batch, batch_idx: int):
        """The ``zoo.Prediction`` of a batch (``x`` or ``(x, y)``) from the fixed draws."""
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        return predict(self.model, self.guide, x, params=self._draws, progress=False)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["zoo_losses"] = torch.tensor(self.losses, dtype=torch.float64)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """A resumed Trainer (``ckpt_path=``) continues the loss history too."""
        if "zoo_losses" in checkpoint:
            self.losses = checkpoint["zoo_losses"].tolist()

    # ---- conversion -------------------------------------------------------------------------
    def to_fit_result(self) -> FitResult:
        """The fitted model and guide as a :class:`zoo.FitResult` (predict, evaluate, plots,
        ArviZ, ``save``/``zoo.load``), with this process's training losses as its history."""
        options = dict(
            guide=getattr(self.guide, "family", None) or type(self.guide).__name__,
            num_steps=self.global_step,
            lr=self.lr,
            elbo=self.objective.elbo,
            estimator=self.objective.estimator,
            per_example=self.per_example,
            trainer="lightning",
        )
        return FitResult(
            model=self.model,
            guide=self.guide,
            losses=list(self.losses),
            device=self.device,
            options=options,
        )

    @classmethod
    def from_fit_result(cls, fit: FitResult, num_data: int, **options) -> BayesianModule:
        """A module around a fit's model and guide (to train on with a Trainer, or predict)."""
        return cls(fit.model, fit.guide, num_data, **options)


def _example(model, example):
    """A batch to create the guide's parameters on."""
    if example is not None:
        x, y = example
        return x[:2], y[:2]
    known = isinstance(model, BayesianModel) and model.input_shape is not None
    if not known or model.likelihood.task != "classification":
        raise ValueError(
            "BayesianModule needs example=(x, y), a small batch of the training data, to create "
            "the guide's parameters (made up only for classifiers that declare input_shape)"
        )
    dtype = next(model.parameters()).dtype
    return torch.zeros(2, *model.input_shape, dtype=dtype), torch.zeros(2, dtype=torch.long)


def _all_gather(tensor: torch.Tensor) -> torch.Tensor:
    """Every rank's ``tensor`` (all of one shape) stacked as ``(W, ...)``, by the process
    group's ``all_gather`` (Lightning's ``self.all_gather`` goes through
    ``torch.distributed.nn.functional.all_gather``, deprecated, one warning per call; no
    gradient is needed here)."""
    dist = torch.distributed
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, tensor.contiguous())
    return torch.stack(parts)


def _merge(gathered: torch.Tensor, dim: int) -> torch.Tensor:
    """``all_gather``'s ``(W, ...)`` stack back into one tensor along ``dim``."""
    return torch.cat(gathered.unbind(0), dim=dim)
