"""The one interface of every approximation the library makes (:class:`Posterior`).

A fitted variational posterior (:class:`zoo.FitResult`), an HMC reference
(:class:`zoo.Reference`), a deep ensemble (:class:`zoo.Ensemble`), a Laplace approximation
(:class:`zoo.LaplaceFit`) and draws made elsewhere (:func:`zoo.from_draws`) answer the same
calls with the same arguments: :meth:`Posterior.predict`, :meth:`~Posterior.evaluate`,
:meth:`~Posterior.sample`, :meth:`~Posterior.to_arviz` and :meth:`~Posterior.save`, each written
once here over the few things a kind provides (its weight draws, how it predicts, what it
saves). A new kind is one subclass that names its kind in its class statement and reads its
files (:meth:`Posterior.read`); :func:`zoo.load`'s table is derived from the registered kinds.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Unpack, cast

import torch

from zoo.arguments import check_bool, check_keywords, check_positive, check_seed
from zoo.data.checks import check_labelled_data
from zoo.data.forms import Data, gather_tensors
from zoo.evaluation.bounds import check_prediction_size
from zoo.evaluation.predictive import predict
from zoo.models.predictions import PredictionT, mixture
from zoo.models.summaries import Summary
from zoo.results import blocks
from zoo.results.contract import Drawing, PredictOptions, register_kind
from zoo.runtime.rng import seeded
from zoo.runtime.serial import one_at_a_time
from zoo.runtime.threads import check_threads
from zoo.storage import files, model_form

if TYPE_CHECKING:  # imported where it is used
    import arviz as az

__all__ = ["Posterior", "PredictOptions"]


class Posterior(Generic[PredictionT]):
    """An approximate posterior over a model's weights that predicts, scores, samples,
    converts to ArviZ and saves.

    Every kind has ``model`` (the Pyro model whose likelihood scores predictions), ``device``
    (where it predicts), ``options`` (how it was made, plain data) and ``wall_time`` (seconds it
    took). A subclass sets :attr:`kind` (its ``kind`` in a saved file) and provides
    :meth:`sample` (and :meth:`chains` where its draws come in chains) and :meth:`payload`;
    it overrides :meth:`predict_with` or :meth:`predict_draws` only when it does not predict by
    running the model's network at weight draws. ``Posterior[ClassificationPrediction]`` (or
    ``[RegressionPrediction]``) tells a type checker what :meth:`predict` returns: a posterior
    over a ``BayesianModel[P]`` is a ``Posterior[P]``.
    """

    #: The ``kind`` entry of a saved file (:func:`zoo.load` picks the reader by it): set by the
    #: class statement, ``class FitResult(Posterior, kind="fit")``, which registers the class
    #: (:data:`zoo.results.contract.KINDS`).
    kind: ClassVar[str] = ""

    def __init_subclass__(cls, kind: str | None = None, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        if kind is not None:
            cls.kind = kind
            register_kind(kind, cls)

    @classmethod
    def read(cls, payload: dict, path: Any, model: Any, map_location: Any) -> Posterior:
        """The posterior a checked file's ``payload`` holds (``zoo.load``'s reader of this
        kind; ``model`` replaces the saved model when given)."""
        raise NotImplementedError(f"{cls.__name__} has no reader")

    #: Networks a prediction draws when ``num_samples`` is not given (``None``: every draw
    #: the posterior holds), and those of :meth:`to_arviz`.
    DEFAULT_SAMPLES: ClassVar[int | None] = 100
    ARVIZ_SAMPLES: ClassVar[int | None] = 200

    if TYPE_CHECKING:  # each kind holds these as fields or properties of its own

        @property
        def model(self) -> Any: ...  # a zoo model, or the Pyro model of a fit

        @property
        def device(self) -> torch.device: ...

        @property
        def options(self) -> Any: ...  # a dict, or a kind's options group

        @property
        def wall_time(self) -> float: ...

    # -- what a kind provides ------------------------------------------------------------

    def sample(self, num_samples: int | None = None, seed: int | None = 0) -> dict:
        """``{site: (S, *site_shape)}``: ``S`` joint draws of every latent site of the model,
        in the constrained space (a noise scale is a standard deviation). ``seed`` fixes
        them without touching the caller's random state (``None``: the global generators)."""
        raise NotImplementedError(f"{type(self).__name__} does not provide weight draws")

    def chains(self, num_samples: int | None = None, seed: int | None = 0) -> dict:
        """``{site: (C, D, *site_shape)}``: the draws of :meth:`sample` as ``C`` chains of
        ``D`` (one chain, unless the kind has chains: an HMC run's, an ensemble's members)."""
        return {k: v.unsqueeze(0) for k, v in self.sample(num_samples, seed).items()}

    def payload(self) -> dict:
        """The posterior as plain data (tensors, numbers, strings, lists and dicts of them):
        what :meth:`save` writes beside the file's ``format``, ``version`` and ``kind``."""
        raise NotImplementedError(f"{type(self).__name__} cannot be saved")

    def draw_blocks(self, num_samples: int | None, seed: int | None) -> Iterator[dict]:
        """:meth:`sample`'s ``num_samples`` draws in consecutive blocks of bounded memory
        (:mod:`zoo.results.blocks`), each ``{site: (S_j, *site_shape)}``; their concatenation
        is ``sample(num_samples, seed)``. By default views of the draws :meth:`sample` holds; a
        kind that draws afresh (a fit's guide) or selects (stored draws) overrides it to hold
        one block at a time."""
        draws = self.sample(num_samples, seed)
        yield from blocks.sliced(draws, blocks.held_per_block(draws))

    def prediction_blocks(self, x: torch.Tensor, options: PredictOptions) -> Iterator[PredictionT]:
        """The predictive on ``x`` (checked options) as consecutive predictions of blocks of
        sampled networks, one block of weight draws held at a time: by default the model's
        network at each block of :meth:`draw_blocks`. Their :func:`~zoo.models.predictions.mixture`
        is :meth:`predict_with`'s prediction; :meth:`evaluate` accumulates them online."""
        for block in self.draw_blocks(options.num_samples, options.seed):
            yield self.predict_draws(x, block, options)

    def predict_with(self, x: torch.Tensor, options: PredictOptions) -> PredictionT:
        """The predictive on ``x`` (checked options): the blocks of
        :meth:`prediction_blocks` side by side (``S = sum_j S_j`` sampled networks)."""
        parts = list(self.prediction_blocks(x, options))
        return parts[0] if len(parts) == 1 else cast(PredictionT, mixture(parts))

    def predict_draws(
        self, x: torch.Tensor, draws: dict, options: PredictOptions | None = None
    ) -> PredictionT:
        """The ``Prediction`` of given weight ``draws`` (``{site: (S, ...)}``, as
        :meth:`sample` returns them) on ``x``: draw ``s`` is one network on every input, as
        ArviZ's ``log_likelihood`` needs. ``options`` (:meth:`predict`'s, bound; default: no
        progress bar, the predictive's own blocks and threads)."""

        options = options or self.draw_options(draws)
        return cast(
            PredictionT,
            predict(
                self.model,
                None,
                x,
                params=draws,
                batch_size=options.batch_size,
                sample_batch_size=options.sample_batch_size,
                progress=options.progress,
                distributed=options.distributed,
                threads=options.threads,
            ),
        )

    def draw_options(self, draws: dict) -> PredictOptions:
        """The default options of :meth:`predict_draws` for ``draws``."""
        return PredictOptions(next(iter(draws.values())).shape[0], progress=False)

    def describe(self) -> dict:
        """``attrs`` of :meth:`to_arviz`'s ``InferenceData``: what made the posterior."""
        return {"inference": type(self).__name__}

    def sample_stats(self) -> dict | None:
        """``{name: (C, D) array}`` for ArviZ's ``sample_stats`` group (a sampler's), or
        ``None``."""
        return None

    @property
    def steps(self) -> int:
        """Optimiser updates taken to make the posterior (0 where none were)."""
        return 0

    def fitting(self) -> dict:
        """How the posterior was fitted, as ``zoo.compare`` shows it: ``steps`` (every
        optimiser update, a rate test's included), ``lr`` (the rate the fit ran at, NaN where
        none did) and ``lr_rule`` (what chose it: ``"given"``, ``"range test"``, ``"default
        (...)"``; empty where nothing was fitted)."""
        return {"steps": self.steps, "lr": math.nan, "lr_rule": ""}

    @property
    def objective(self) -> str:
        """What :attr:`final_elbo` bounds (``guides.registry.OBJECTIVES``: ``"model"``, the evidence
        of the model as written; ``"whvi_model"``; ``"conditional"`` on point masses; ``"map"``;
        ``"mc_dropout"``), ``"none"`` for a posterior that is not variational."""
        return "none"

    @property
    def final_elbo(self) -> float:
        """The ELBO the posterior reached (full-data scale), NaN where it has none."""
        return math.nan

    def num_variational_parameters(self) -> int | float:
        """Numbers that define the posterior (NaN for draws, which are a sample of it)."""
        return math.nan

    # -- the calls every kind answers ----------------------------------------------------

    @one_at_a_time
    def predict(
        self,
        x: torch.Tensor,
        num_samples: int | None = None,
        batch_size: int | None = None,
        sample_batch_size: int | None = None,
        **drawing: Unpack[Drawing],
    ) -> PredictionT:
        """The posterior predictive on ``x``: ``num_samples`` networks drawn from the posterior
        (its :data:`DEFAULT_SAMPLES` when not given; every draw of a reference), evaluated in
        blocks of ``batch_size`` inputs (:func:`zoo.evaluation.predictive.predict`).

        ``sample_batch_size > 1`` evaluates that many draws per vectorised pass. The keywords
        of ``drawing`` (:class:`zoo.results.contract.Drawing`, as :meth:`evaluate`'s and
        :meth:`to_arviz`'s): ``seed`` (default 0) fixes the draws, the caller's random state
        untouched, ``None`` draws from the global generators; ``progress`` shows a bar after
        two seconds; ``threads`` follows ``zoo.fit``'s rule (the caller's setting restored
        after); ``distributed=True``, on every rank of a distributed run, shards ``x`` over
        the ranks and gathers the outputs once.

        Memory: the weight draws are made and used in blocks of at most
        :data:`zoo.results.blocks.DRAW_MEMORY` bytes (:meth:`prediction_blocks`), so a
        prediction holds one block of weights and the outputs, ``S x N x outputs`` numbers
        (twice for classification: logits and probabilities); :meth:`evaluate` holds not even
        those, only per-input running sums.

        Returns a :class:`zoo.ClassificationPrediction` or :class:`zoo.RegressionPrediction`
        (the model's likelihood decides)."""
        check_keywords("predict", drawing, Drawing)
        options = self.predict_options(
            num_samples, batch_size, sample_batch_size=sample_batch_size, **drawing
        )
        if options.num_samples is not None:  # the result's size, before any draw
            check_prediction_size(self.model, x, options.num_samples, self.device)
        return self.predict_with(x, options)

    def sample_size(self, num_samples: int | None, seed: int | None) -> int:
        """:meth:`sample`'s arguments checked: ``num_samples``, or the kind's
        :data:`DEFAULT_SAMPLES` when not given (a kind without one takes every draw it holds
        and does not call this)."""
        size = self.DEFAULT_SAMPLES if num_samples is None else num_samples
        if size is None:
            raise ValueError(f"{type(self).__name__} has no default number of draws: pass one")
        check_positive(num_samples=size)
        check_seed(seed)
        return size

    def predict_options(
        self,
        num_samples: int | None,
        batch_size: int | None = None,
        seed: int | None = 0,
        progress: bool = True,
        threads: int | str | None = "auto",
        distributed: bool = False,
        sample_batch_size: int | None = None,
    ) -> PredictOptions:
        """:meth:`predict`'s arguments checked and bound (``num_samples`` defaulted; the
        defaults are those of :class:`~zoo.results.contract.Drawing`'s keywords)."""
        check_positive(
            num_samples=num_samples, batch_size=batch_size, sample_batch_size=sample_batch_size
        )
        check_seed(seed)
        check_bool(progress=progress, distributed=distributed)
        check_threads(threads)
        if num_samples is None:
            num_samples = self.DEFAULT_SAMPLES
        return PredictOptions(
            num_samples, batch_size, sample_batch_size, seed, progress, threads, distributed
        )

    @one_at_a_time
    def evaluate(
        self,
        data: Data,
        num_samples: int | None = None,
        batch_size: int | None = None,
        **drawing: Unpack[Drawing],
    ) -> dict[str, float]:
        """Metrics on held-out ``data`` (``(X, y)``, a ``Dataset`` or a ``DataLoader``) of
        :meth:`predict`'s predictive (the same arguments), as the model's likelihood defines
        them (``zoo.models.likelihoods``).

        Classification: ``accuracy``, ``nll`` (mean negative log predictive probability),
        ``brier``, ``ece`` (15 bins). Regression: ``rmse``, ``nll`` (mean negative log
        predictive *density* of the sample mixture, in the units of ``y``: it can be negative),
        ``coverage_95`` (the share of targets inside the central 95% predictive interval: about
        0.95 for a calibrated predictive, lower when it is overconfident). The data are checked
        against the model before any prediction.

        The metrics are accumulated online over blocks of sampled networks
        (:meth:`prediction_blocks`; :mod:`zoo.models.summaries`): the call holds one block of
        weight draws and per-input sums (``N x outputs``), never the ``S x N`` outputs, and
        returns what the whole prediction's metrics are, to float rounding."""
        check_keywords("evaluate", drawing, Drawing)
        options = self.predict_options(num_samples, batch_size, **drawing)
        x, y = gather_tensors(data)
        check_labelled_data(self.model, x, y, self.device)
        return self.summarise(x, y, options).metrics()

    def summarise(self, x: torch.Tensor, y: torch.Tensor, options: PredictOptions) -> Summary:
        """The predictive on checked inputs ``x`` against targets ``y`` accumulated online
        over :meth:`prediction_blocks` (:mod:`zoo.models.summaries`): what :meth:`evaluate`
        reads its metrics from, and ``zoo.compare`` its distances."""
        summary = None
        for part in self.prediction_blocks(x, options):  # one block of networks at a time
            if summary is None:
                summary = self.model.likelihood.summary(y.to(part.outputs.device))
            summary.add(part)
        assert summary is not None  # a prediction has at least one block
        return summary

    @one_at_a_time
    def to_arviz(
        self,
        data: Data | None = None,
        num_samples: int | None = None,
        var_names: Sequence[str] | str | None = None,
        **drawing: Unpack[Drawing],
    ) -> az.InferenceData:
        """An ArviZ ``InferenceData`` of the posterior.

        Groups: ``posterior``, the draws of :meth:`chains` (``num_samples`` of them,
        :data:`ARVIZ_SAMPLES` by default; every draw of a reference) with dims ``(chain,
        draw, ...)`` and named dims per layer such as ``fc1_out``, ``fc1_in``
        (:func:`zoo.evaluation.arviz.site_dims`); ``sample_stats`` where the kind has a
        sampler's; with ``data = (X, y)`` also ``log_likelihood`` (``obs``:
        ``log p(y_n | x_n, w_s)`` of each draw), ``posterior_predictive`` (``obs``: one
        replicated ``y`` per draw) and ``observed_data``. ``attrs`` say what made the
        posterior. ``var_names`` (names or regular expressions) keeps some sites in
        ``posterior``; predictions use every site. ``seed`` fixes the draws and the replicated
        ``y``; ``progress``, ``threads`` and ``distributed`` are :meth:`predict`'s.

        Several chains (an HMC reference's, an ensemble's members) make ``az.summary``'s R-hat
        compare them; one chain of independent variational draws has an ESS of about ``S``
        and no meaningful R-hat (see :mod:`zoo.evaluation.arviz`)."""
        from zoo.evaluation import arviz as bridge

        default = self.ARVIZ_SAMPLES if num_samples is None else num_samples
        check_keywords("to_arviz", drawing, Drawing)
        options = self.predict_options(default, **drawing)
        seed = options.seed
        xy = None
        if data is not None:
            xy = gather_tensors(data)
            check_labelled_data(self.model, *xy, self.device)
        chains = self.chains(options.num_samples, seed)
        c, d = next(iter(chains.values())).shape[:2]
        keep = bridge.select_sites(list(chains), var_names)
        groups = {"posterior": {name: chains[name].cpu().numpy() for name in keep}}
        dims = {name: bridge.site_dims(name, chains[name].shape[2:]) for name in keep}
        stats = self.sample_stats()
        if stats is not None:
            groups["sample_stats"] = stats
        if xy is not None:
            x, y = xy
            flat = {k: v.reshape(c * d, *v.shape[2:]) for k, v in chains.items()}
            pred = self.predict_draws(x, flat, options)
            y = y.to(pred.outputs.device)
            log_lik = pred.log_likelihood(y)
            assert pred.likelihood is not None  # a model's predictions carry theirs
            with seeded(seed, pred.outputs.device):
                replicated = pred.likelihood.sample()

            def per_chain(t):
                return t.cpu().numpy().reshape(c, d, *t.shape[1:])

            bridge.add_data_groups(groups, dims, per_chain(log_lik), per_chain(replicated), y)
        attrs = {**self.describe(), "inference_library": "pyro + bnn-zoo"}
        return bridge.from_groups(groups, dims, attrs)

    def training_data(self) -> dict[str, tuple[int, ...]]:
        """The training examples this posterior holds and :meth:`save` writes, ``{entry:
        shape}`` (``{}``: none): a fit of a network with batch norm (``statistics="per_draw"``,
        the default) keeps up to 512 training inputs (``model.statistics_inputs``,
        :mod:`zoo.models.per_draw`), an ensemble's members each their own. No other form
        holds training data: a Laplace file holds a zero row of the inputs' shape where
        laplace-torch keeps a minibatch, checkpoints leave the kept inputs out, and
        ``options["data"]`` is the data's size, shapes and digest."""
        held: dict[str, tuple[int, ...]] = {}
        for where, value in model_form.kept_inputs(self.payload()):
            held[where] = tuple(value.shape)
        return held

    def save(self, path: str | os.PathLike, training_data: bool = True) -> os.PathLike:
        """Write the posterior to ``path`` atomically, as plain data with its ``kind``
        (:meth:`payload`); :func:`zoo.load` reads it back without unpickling code (pass
        ``model=`` there for a network that is not a ``zoo.models`` class).

        The file holds the training inputs :meth:`training_data` lists (a per-draw fit's
        batch norm inputs), unless ``training_data=False``: then none, and the loaded
        posterior's predictions normalise every draw with the network's running statistics
        (re-estimated at the fitted posterior at the end of the fit), as a fit with
        ``statistics="refresh"`` does, instead of each draw's own."""
        check_bool(training_data=training_data)
        content = {"format": files.FORMAT, "version": files.VERSION, "kind": self.kind}
        payload = self.payload()
        if not training_data:
            payload = model_form.without_kept_inputs(payload)
        return files.atomic_save({**content, **payload}, path)
