"""A Laplace approximation (:class:`LaplaceFit`, made by :func:`zoo.laplace`) as a
:class:`zoo.Posterior`, and reading one back (laplace-torch's bridge:
:mod:`zoo.results.laplace_torch`)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from zoo.data.checks import check_inputs
from zoo.models.predictions import PredictionT
from zoo.results import blocks
from zoo.results.laplace_checks import check_laplace_payload, check_options_entry, plain, tensors
from zoo.results.laplace_torch import (
    LaplaceOptions,
    build,
    laplace_torch_call,
    linearised_outputs,
    weight_draws,
)
from zoo.results.posterior import Posterior, PredictOptions
from zoo.runtime.threads import intra_op_threads
from zoo.storage import files, model_form


@dataclass(repr=False)
class LaplaceFit(Posterior[PredictionT], kind="laplace"):
    """A Laplace approximation of a zoo model at its MAP weights, ``q(w) = N(w*, (H + P)^-1)``
    (:mod:`zoo.results.laplace_torch`), as a :class:`zoo.Posterior`.

    Attributes
    ----------
    model
        The zoo model (its likelihood scores predictions).
    laplace
        laplace-torch's fitted object (``laplace.BaseLaplace``).
    options : LaplaceOptions
    map_weights : dict
        ``{site: tensor}``, the MAP weights the approximation is centred on.
    wall_time : float
        Seconds of the MAP fit (when one was run) and the Laplace fit together.
    """

    model: Any
    laplace: Any  # laplace-torch's BaseLaplace (imported only where it is used)
    options: LaplaceOptions
    map_weights: dict
    wall_time: float = 0.0
    info: dict = field(default_factory=dict)

    @classmethod
    def read(cls, payload: dict, path: Any, model: Any, map_location: Any) -> Posterior:
        """:func:`laplace_from_payload` (``zoo.load``'s reader of this kind)."""
        return laplace_from_payload(payload, path, model, map_location)

    def __repr__(self) -> str:
        o = self.options
        return (
            f"LaplaceFit({o.weights}, {o.hessian} Hessian, {o.predictive} predictive, "
            f"model={type(self.model).__name__}, wall_time={self.wall_time:.1f} s)"
        )

    @property
    def device(self) -> torch.device:
        return next(iter(self.map_weights.values())).device

    @property
    def steps(self) -> int:
        return int(self.info.get("map_steps", 0))

    def fitting(self) -> dict:
        """See :meth:`zoo.Posterior.fitting`: the MAP fit's (``info["map_fit"]``), or
        ``"post hoc"`` at weights given."""
        fitted = self.info.get("map_fit")
        if fitted is None:
            return {"steps": 0, "lr": math.nan, "lr_rule": "post hoc (MAP weights given)"}
        return dict(fitted)

    def num_variational_parameters(self) -> int:
        """The MAP weights and the Laplace posterior's own numbers (its curvature factors)."""
        state = self.laplace.state_dict()
        curvature = sum(t.numel() for t in tensors(state["H"]))
        return sum(w.numel() for w in self.map_weights.values()) + curvature

    def prediction_blocks(self, x: torch.Tensor, options: PredictOptions) -> Iterator[PredictionT]:
        """The predictive on ``x`` as the library's ``Prediction``: ``num_samples`` function
        samples (``"glm"``, ``"nn"``), or the probit probabilities as one sample; inputs in
        blocks of ``batch_size`` (default 1,024; 16 for the GLM predictive of all weights,
        which holds a ``(block, outputs, weights)`` Jacobian). The ``"nn"`` predictive draws
        its weights in blocks of bounded memory (:mod:`zoo.results.blocks`), one prediction
        each. ``seed`` fixes the draws (``None``: torch's global generator); ``threads`` as a
        number sets torch's CPU threads for the passes. laplace-torch predicts on one device:
        with ``distributed=True`` every rank computes the whole prediction (the same on
        each)."""
        num_samples, batch_size = options.num_samples, options.batch_size
        device = self.device
        generator = None
        if options.seed is not None:
            generator = torch.Generator(device=device).manual_seed(options.seed)
        if self.options.weights == "subnetwork" and self.options.predictive == "glm":
            # the linearised network at joint weight draws: laplace-torch's per-input Cholesky
            # of the function covariance fails where the chosen weights do not reach an output
            yield from super().prediction_blocks(x.to(device), options)
            return
        if batch_size is None:  # the GLM predictive of all weights holds a Jacobian per input
            glm_all = self.options.weights == "all" and self.options.predictive == "glm"
            batch_size = 16 if glm_all else 1024
        check_inputs(self.model, x, device)
        threads = options.threads if isinstance(options.threads, int) else None
        assert num_samples is not None  # a Laplace fit has a default number of draws
        sizes = [num_samples]
        if self.options.predictive == "nn":  # a block of weight draws per laplace-torch call
            weights = 4 * int(self.laplace.n_params)  # float32 draws of the weights it covers
            sizes = blocks.block_sizes(num_samples, blocks.draws_per_block(weights))
        for size in sizes:
            parts = []
            with intra_op_threads(threads):  # "auto": laplace-torch's passes, its own count
                for start in range(0, x.shape[0], batch_size):
                    chunk = x[start : start + batch_size].to(device)
                    with laplace_torch_call("LaplaceFit.predict"):
                        parts.append(self._outputs(chunk, size, generator))
            outputs = torch.cat(parts, dim=1)
            noise = self.laplace.sigma_noise.detach().reshape(-1)[:1].to(outputs)
            params = {"noise": noise.expand(outputs.shape[0])}
            yield self.model.likelihood.predict(outputs, params)

    def _outputs(self, x, num_samples, generator) -> torch.Tensor:
        """``(S, n, out)`` network outputs (logits or means) of one block of inputs."""
        if self.options.predictive == "probit":
            probs = self.laplace(x, pred_type="glm", link_approx="probit")
            return probs.clamp_min(1e-30).log().unsqueeze(0)
        if self.options.predictive == "nn":  # sampled networks (probabilities for classes)
            samples = self.laplace.predictive_samples(
                x, pred_type="nn", n_samples=num_samples, generator=generator
            )
            if self.model.likelihood.task == "classification":
                samples = samples.clamp_min(1e-30).log()  # logits of the same distribution
        else:
            samples = self.laplace.functional_samples(
                x, pred_type="glm", n_samples=num_samples, generator=generator
            )
        return samples.reshape(num_samples, x.shape[0], -1).detach()

    def sample(self, num_samples: int | None = None, seed: int | None = 0) -> dict:
        """``{site: (S, *shape)}``: ``S`` joint draws of the weights from the Laplace
        posterior ``N(w*, (H + P)^-1)`` (laplace-torch's ``sample``); sites it does not cover
        (the body of a last-layer approximation, a learned noise) repeat their MAP values.
        ``seed`` fixes the draws (``None``: torch's global generator)."""
        num_samples = self.sample_size(num_samples, seed)
        generator = None
        if seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(seed)
        with laplace_torch_call("LaplaceFit.sample"):
            return weight_draws(self.laplace, self.map_weights, num_samples, generator)

    def predict_draws(
        self, x: torch.Tensor, draws: dict, options: PredictOptions | None = None
    ) -> PredictionT:
        """The ``Prediction`` of the weight ``draws`` (:meth:`sample`) on ``x``: the networks
        at the draws for the ``"nn"`` predictive and for a last layer (in whose weights the
        network is linear, so its GLM predictive is the same), the network linearised at the
        MAP weights, ``f(x, w*) + J(x) (w_s - w*)``, for the GLM and probit predictives of
        all weights or a subnetwork (whose GLM ``predict`` is this). Unlike :meth:`predict`'s
        function samples, one draw is one network on every input, as ArviZ's
        ``log_likelihood`` needs."""
        options = options or self.draw_options(draws)
        if self.options.predictive == "nn" or self.options.weights == "last_layer":
            return super().predict_draws(x, draws, options)
        check_inputs(self.model, x, self.device)
        batch_size = options.batch_size or 256
        blocks = [
            linearised_outputs(self.laplace, self.map_weights, draws, x[i : i + batch_size])
            for i in range(0, x.shape[0], batch_size)
        ]
        outputs = torch.cat(blocks, dim=1)
        noise = draws["noise"].reshape(-1) if "noise" in draws else None
        return self.model.likelihood.predict(outputs, {} if noise is None else {"noise": noise})

    def payload(self) -> dict:
        """The model, the MAP weights, the options and laplace-torch's state (its curvature
        factors, prior precision, noise; for a last layer, a zero input and target of the
        training data's shapes where laplace-torch keeps its first training minibatch, which
        it reads to find the layer); :func:`zoo.load` reads it with laplace-torch installed."""
        state = {k: plain(v) for k, v in self.laplace.state_dict().items()}
        # a last layer's first training minibatch, which laplace-torch runs the network on
        # to find the layer: a zero row of its shapes finds the same one, and holds no data
        data = state.get("data")
        if isinstance(data, (list, tuple)) and all(torch.is_tensor(t) for t in data):
            state["data"] = [torch.zeros_like(t[:1]) for t in data]
        return {
            "model": model_form.model_payload(self.model),
            "map_weights": {k: v.detach().cpu() for k, v in self.map_weights.items()},
            "options": asdict(self.options),
            "state": state,
            "wall_time": float(self.wall_time),
            "info": files.plain_data(self.info),
        }

    def describe(self) -> dict:
        """Which weights, the Hessian's structure and the predictive."""
        o = self.options
        return {"inference": f"Laplace ({o.weights}, {o.hessian} Hessian, {o.predictive} "
                f"predictive; laplace-torch)"}  # fmt: skip


def laplace_from_payload(payload: dict, path, model, map_location) -> LaplaceFit:
    """The approximation of a file's ``payload``, every entry checked before anything is built
    from it (:func:`zoo.results.laplace_checks.check_laplace_payload`): the options, the MAP
    weights against the model's sites, the curvature's structure and values, the precisions."""
    keys = ("model", "map_weights", "options", "state", "wall_time", "info")
    files.require(payload, keys, path)
    options = check_options_entry(payload["options"], path)
    try:
        model = model_form.restore_model(payload["model"], model)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
    check_laplace_payload(payload, path, model, options)
    model.to(map_location)
    weights = {k: v.to(map_location) for k, v in payload["map_weights"].items()}
    state, info = payload["state"], payload["info"]
    with laplace_torch_call(str(path)):
        la = build(model, {k: v for k, v in weights.items() if k != "noise"}, options,
                   last_layer_name=state.get("_last_layer_name"),
                   indices=info.get("subnetwork_indices"))  # fmt: skip
        try:
            la.load_state_dict(state)
        except (ValueError, KeyError, RuntimeError, TypeError, IndexError) as err:
            raise ValueError(f"{path}: laplace-torch refused the saved state ({err})") from None
    return LaplaceFit(model, la, options, weights, float(payload["wall_time"]), dict(info))
