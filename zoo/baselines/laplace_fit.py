"""The Laplace approximation's result and its entry point, :func:`laplace` (laplace-torch's
bridge and options: :mod:`zoo.baselines.laplace_torch`)."""

from __future__ import annotations

import os
import warnings
from dataclasses import asdict, dataclass, field

import torch

from zoo.baselines.laplace_torch import (
    LaplaceOptions,
    build,
    check_laplace_model,
    dependency_notices_off,
    import_laplace,
    linearised_outputs,
    plain,
    subnetwork_indices,
    tensors,
    weight_draws,
)
from zoo.data.checks import check_labelled_data, gather_tensors
from zoo.evaluation.scoring import evaluate
from zoo.models import stored
from zoo.models.predictions import Prediction
from zoo.runtime import files
from zoo.runtime.arguments import check_positive, check_seed


@dataclass
class LaplaceFit:
    """A Laplace approximation of a zoo model at its MAP weights (see the module docstring).

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

    model: object
    laplace: object
    options: LaplaceOptions
    map_weights: dict
    wall_time: float = 0.0
    info: dict = field(default_factory=dict)

    @property
    def device(self) -> torch.device:
        return next(iter(self.map_weights.values())).device

    @property
    def steps(self) -> int:
        return int(self.info.get("map_steps", 0))

    def num_variational_parameters(self) -> int:
        """The MAP weights and the Laplace posterior's own numbers (its curvature factors)."""
        state = self.laplace.state_dict()
        curvature = sum(t.numel() for t in tensors(state["H"]))
        return sum(w.numel() for w in self.map_weights.values()) + curvature

    def predict(
        self,
        x: torch.Tensor,
        num_samples: int = 100,
        batch_size: int | None = None,
        progress: bool = True,
        seed: int | None = 0,
        threads: int | str | None = "auto",
    ) -> Prediction:
        """The predictive on ``x`` as the library's ``Prediction``: ``num_samples`` function
        samples (``"glm"``, ``"nn"``), or the probit probabilities as one sample; inputs in
        blocks of ``batch_size`` (default 1,024; 16 for the GLM predictive of all weights,
        which holds a ``(block, outputs, weights)`` Jacobian). ``seed`` fixes the draws
        (``None``: torch's global generator); ``progress`` and ``threads`` are accepted for a
        fit's signature."""
        check_positive(num_samples=num_samples, batch_size=batch_size)
        check_seed(seed)
        device = self.device
        generator = None
        if seed is not None:
            generator = torch.Generator(device=device).manual_seed(seed)
        if self.options.weights == "subnetwork" and self.options.predictive == "glm":
            # the linearised network at joint weight draws: laplace-torch's per-input Cholesky
            # of the function covariance fails where the chosen weights do not reach an output
            return self.predict_at(x.to(device), self.sample(num_samples, seed), batch_size)
        if batch_size is None:  # the GLM predictive of all weights holds a Jacobian per input
            glm_all = self.options.weights == "all" and self.options.predictive == "glm"
            batch_size = 16 if glm_all else 1024
        blocks = []
        for start in range(0, x.shape[0], batch_size):
            chunk = x[start : start + batch_size].to(device)
            with dependency_notices_off():
                blocks.append(self._outputs(chunk, num_samples, generator))
        outputs = torch.cat(blocks, dim=1)
        noise = self.laplace.sigma_noise.detach().reshape(-1)[:1].to(outputs)
        params = {"noise": noise.expand(outputs.shape[0])}
        return self.model.likelihood.predict(outputs, params)

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

    def sample(self, num_samples: int = 200, seed: int | None = 0) -> dict[str, torch.Tensor]:
        """``{site: (S, *shape)}``: ``S`` joint draws of the weights from the Laplace
        posterior ``N(w*, (H + P)^-1)`` (laplace-torch's ``sample``); sites it does not cover
        (the body of a last-layer approximation, a learned noise) repeat their MAP values.
        ``seed`` fixes the draws (``None``: torch's global generator)."""
        check_positive(num_samples=num_samples)
        check_seed(seed)
        generator = None
        if seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(seed)
        return weight_draws(self.laplace, self.map_weights, num_samples, generator)

    def predict_at(self, x: torch.Tensor, draws: dict, batch_size: int | None = None):
        """The ``Prediction`` of the weight ``draws`` (:meth:`sample`) on ``x``: the networks
        at the draws for the ``"nn"`` predictive and for a last layer (in whose weights the
        network is linear, so its GLM predictive is the same), the network linearised at the
        MAP weights, ``f(x, w*) + J(x) (w_s - w*)``, for the GLM and probit predictives of
        all weights or a subnetwork (whose GLM ``predict`` is this). Unlike :meth:`predict`'s
        function samples, one draw is one network on every input, as ArviZ's
        ``log_likelihood`` needs."""
        from zoo.evaluation.predictive import predict

        if self.options.predictive == "nn" or self.options.weights == "last_layer":
            return predict(self.model, None, x, params=draws, batch_size=batch_size,
                           progress=False)  # fmt: skip
        batch_size = batch_size or 256
        blocks = [
            linearised_outputs(self.laplace, self.map_weights, draws, x[i : i + batch_size])
            for i in range(0, x.shape[0], batch_size)
        ]
        outputs = torch.cat(blocks, dim=1)
        noise = draws["noise"].reshape(-1) if "noise" in draws else None
        return self.model.likelihood.predict(outputs, {} if noise is None else {"noise": noise})

    def to_arviz(
        self,
        data=None,
        num_samples: int = 200,
        var_names=None,
        seed: int | None = 0,
        progress: bool = True,
    ):
        """ArviZ ``InferenceData`` of the approximation: :meth:`sample`'s draws as one chain,
        and with ``data`` the groups of :meth:`predict_at`; see
        :func:`zoo.arviz.laplace_inference_data`."""
        from zoo.arviz import laplace_inference_data

        return laplace_inference_data(self, data, num_samples, var_names, seed, progress)

    def evaluate(
        self,
        data,
        num_samples: int = 100,
        batch_size: int | None = None,
        seed: int | None = 0,
        progress: bool = True,
        threads: int | str | None = "auto",
    ) -> dict[str, float]:
        """Held-out metrics of the predictive, as :meth:`zoo.FitResult.evaluate` defines
        them for the model's likelihood."""
        return evaluate(self, data, num_samples=num_samples, batch_size=batch_size, seed=seed)

    def save(self, path: str | os.PathLike) -> os.PathLike:
        """Write the approximation to ``path`` (atomically) as plain data: the model, the MAP
        weights, the options and laplace-torch's state (its curvature factors, prior
        precision, noise). ``zoo.load(path)`` reads it (laplace-torch installed)."""
        state = {k: plain(v) for k, v in self.laplace.state_dict().items()}
        return files.atomic_save(
            {
                "format": files.FORMAT,
                "version": files.VERSION,
                "kind": "laplace",
                "model": stored.model_payload(self.model),
                "map_weights": {k: v.detach().cpu() for k, v in self.map_weights.items()},
                "options": asdict(self.options),
                "state": state,
                "wall_time": float(self.wall_time),
                "info": files.plain_data(self.info),
            },
            path,
        )


def laplace(
    model,
    data,
    *,
    at=None,
    options: LaplaceOptions | dict | None = None,
    progress: bool = True,
    **fit_options,
) -> LaplaceFit:
    """The Laplace approximation of ``model``'s posterior on ``data`` through laplace-torch.

    Parameters
    ----------
    model
        A zoo model built on a plain network (``zoo.models.*``, ``zoo.models.from_module``);
        its likelihood decides laplace-torch's (classification, or regression with one noise
        level: fixed, or the MAP fit's learned ``noise``).
    data
        Training data (``(X, y)``, a Dataset or a DataLoader), held in memory.
    at : FitResult or "module", optional
        Where the Gaussian is centred: by default a ``zoo.fit(model, "map", data,
        **fit_options)`` is run first; a ``FitResult`` gives its guide's median (a point mass's
        weights; a variational fit's means); ``"module"`` takes the weights of ``model.net`` as
        they are (a network trained outside the library and converted).
    options : LaplaceOptions or dict, optional
        Which weights, the Hessian's structure, the prior precision, the predictive.
    progress : bool, default True
        The MAP fit's progress bar.
    **fit_options
        Passed to the MAP fit's ``zoo.fit`` (``epochs``, ``lr``, ``seed``, option groups);
        its ``batch_size`` (default 128) is also that of laplace-torch's pass over the data.

    Everything laplace-torch cannot do with the model, and a missing laplace-torch, is refused
    before any fit.
    """
    import time

    from torch.utils.data import DataLoader, TensorDataset

    from zoo.training.fitting import fit
    from zoo.training.options import grouped
    from zoo.training.result import FitResult

    options = LaplaceOptions.of(options)
    check_laplace_model(model, options)
    batch_size = fit_options.get("batch_size") or 128
    check_positive(batch_size=batch_size)
    if not (at is None or at == "module" or isinstance(at, FitResult)):
        raise TypeError(f"at must be None, a FitResult or 'module', got {at!r}")
    import_laplace()
    x, y = gather_tensors(data)
    start, info = time.perf_counter(), {}
    if at == "module":
        weights = {
            n: p.detach().clone() for n, p in model.net.named_parameters() if n in model.site_shapes
        }
    else:
        if at is None:
            args = grouped(fit_options if "run" in fit_options else {"progress": progress,
                                                                      **fit_options})  # fmt: skip
            at = fit(model, "map", data, **args)
            info["map_steps"] = at.steps
        weights = {k: v.detach() for k, v in at.guide.median().items()}
    device = next(iter(weights.values())).device
    check_labelled_data(model, x, y, device)
    net_weights = {k: v for k, v in weights.items() if k != "noise"}
    indices = None
    if options.weights == "subnetwork":
        indices = subnetwork_indices(model, net_weights, options.subnetwork_size)
        info["subnetwork_indices"] = indices.tolist()
    la = build(model, net_weights, options, indices=indices)
    if "noise" in weights:
        la.sigma_noise = weights["noise"].reshape(()).to(device)
    if model.likelihood.task == "regression":
        y = y.reshape(len(y), -1)  # laplace-torch's regression targets are (N, outputs)
    loader = DataLoader(TensorDataset(x.to(device), y.to(device)), batch_size=batch_size)
    with dependency_notices_off():
        la.fit(loader)
    if options.prior_precision == "marglik":
        pred_type = "nn" if options.predictive == "nn" else "glm"
        with dependency_notices_off(), warnings.catch_warnings():
            # laplace-torch's note on link_approx, which the marginal likelihood does not use
            warnings.filterwarnings("ignore", "By default `link_approx`", UserWarning)
            la.optimize_prior_precision(pred_type=pred_type, method="marglik")
    info["prior_precision"] = la.prior_precision.detach().reshape(-1).tolist()
    return LaplaceFit(model, la, options, weights, time.perf_counter() - start, info)


def laplace_from_payload(payload: dict, path, model, map_location) -> LaplaceFit:
    """The approximation of a file's ``payload``, checked before anything is built from it."""
    from zoo.runtime import file_checks

    keys = ("model", "map_weights", "options", "state", "wall_time", "info")
    files.require(payload, keys, path)
    file_checks.check_tensors(payload["map_weights"], path, "map_weights")
    options = LaplaceOptions(**payload["options"])
    try:
        model = stored.restore_model(payload["model"], model)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
    model.to(map_location)
    weights = {k: v.to(map_location) for k, v in payload["map_weights"].items()}
    state = payload["state"]
    la = build(model, {k: v for k, v in weights.items() if k != "noise"}, options,
               last_layer_name=state.get("_last_layer_name"),
               indices=payload["info"].get("subnetwork_indices"))  # fmt: skip
    try:
        la.load_state_dict(state)
    except (ValueError, KeyError, RuntimeError) as err:
        raise ValueError(f"{path}: laplace-torch refused the saved state ({err})") from None
    return LaplaceFit(model, la, options, weights, payload["wall_time"], dict(payload["info"]))
