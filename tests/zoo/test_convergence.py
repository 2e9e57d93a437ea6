"""zoo.convergence: num_steps="auto" stops on a plateau, not on noise; the cap holds; a resumed
fit keeps its windows."""

from __future__ import annotations

import pytest
import torch

import zoo
from tests.zoo.linear_gaussian import MEAN_FIELD_FIT, correlated_data, model_for
from zoo.convergence import Convergence, resolve


def _noisy(curve, sd=5.0, seed=0) -> list[float]:
    g = torch.Generator().manual_seed(seed)
    base = torch.as_tensor(curve, dtype=torch.float64)
    return (base + sd * torch.randn(len(base), generator=g, dtype=torch.float64)).tolist()


def test_a_noisy_plateau_stops_and_a_noisy_descent_goes_on():
    rule = Convergence(window=200, tolerance=1e-3, patience=2)
    steps = torch.arange(2000, dtype=torch.float64)
    # Noise of sd 5 on a loss near 1,000: single steps differ by 0.5%, far above tolerance.
    plateau = _noisy(torch.full((2000,), 1000.0))
    assert rule.converged(plateau)
    # Falling by 2 per 100 steps (4 per window, 0.4%): every window improves beyond tolerance.
    descent = _noisy(1000.0 - 0.02 * steps)
    assert not rule.converged(descent)
    # Levelling off: falling until step 1200, flat after; stalled from the windows after it.
    bend = _noisy(1000.0 - 0.05 * steps.clamp(max=1200))
    assert not rule.converged(bend[:1200]) and rule.converged(bend)
    assert not rule.converged(plateau[:599])  # three complete windows are needed (patience 2)


def test_options_are_checked():
    with pytest.raises(ValueError, match="window must be a positive integer"):
        Convergence(window=0)
    with pytest.raises(ValueError, match="tolerance must be >= 0"):
        Convergence(tolerance=-1)
    with pytest.raises(ValueError, match="'auto' or a zoo.Convergence, got 'forever'"):
        resolve("forever")
    assert resolve("auto") == (Convergence().cap, Convergence())
    assert resolve(300) == (300, None)


def _fit(num_steps, **options):
    x, y = correlated_data(n=300, d=3, corr=0.5)
    fit_options = {**MEAN_FIELD_FIT, "batch_size": 300, "progress": False, **options}
    return zoo.fit(model_for(3), "diagonal", (x, y), num_steps=num_steps, **fit_options)


def test_auto_stops_a_fit_that_has_converged_and_says_why():
    rule = Convergence(window=100, tolerance=1e-3, patience=2, cap=5000)
    fit = _fit(rule)
    assert fit.options["stopped"] == "converged"
    assert fit.steps == fit.options["stopped_at"] < 5000 and fit.steps % 100 == 0
    assert rule.converged(fit.losses) and not rule.converged(fit.losses[:-100])
    assert _fit(40).options["stopped"] == "num_steps"


def test_the_cap_holds():
    fit = _fit(Convergence(window=50, tolerance=0.0, cap=120))  # nothing ever stalls
    assert fit.steps == 120 and fit.options["stopped"] == "cap"


def test_a_resumed_fit_keeps_its_windows(tmp_path):
    rule = Convergence(window=100, tolerance=1e-3, patience=2, cap=5000)
    whole = _fit(rule)
    path = tmp_path / "fit.ckpt"
    cut = _fit(rule, checkpoint=path, checkpoint_every=50, callbacks=[lambda s: s.step == 250])
    assert cut.steps == 250 and cut.options["stopped"] == "callback"
    resumed = _fit(rule, checkpoint=path, checkpoint_every=50, resume=path)
    assert resumed.steps == whole.steps and resumed.options["stopped"] == "converged"
    assert resumed.losses == whole.losses


def test_auto_keeps_the_small_regression_recipe_at_a_constant_rate():
    x, y = zoo.data.toy_regression(n=64)
    rule = Convergence(window=20, patience=1, tolerance=0.5, cap=400)  # stops soon
    fit = zoo.fit(
        zoo.models.BayesianMLP(1, (8,)), "diagonal", (x, y), num_steps=rule, progress=False
    )
    assert fit.options["recipe"] == "small regression data, length auto"
    assert fit.options["batch_size"] == 64 and fit.options["lr"] == 1e-2
    assert fit.options["stopped"] == "converged" and fit.steps < 400
