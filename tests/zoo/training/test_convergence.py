"""zoo.training.convergence: num_steps="auto" stops on a plateau, not on noise; the cap holds; a
resumed fit keeps its windows."""

from __future__ import annotations

import pytest
import torch

import zoo
from tests.zoo.linear_gaussian import MEAN_FIELD_FIT, MEAN_FIELD_GUIDE, correlated_data, model_for
from zoo.training.convergence import Convergence, ConvergenceTracker, resolve
from zoo.training.options import grouped


def _noisy(curve, sd=5.0, seed=0) -> list[float]:
    g = torch.Generator().manual_seed(seed)
    base = torch.as_tensor(curve, dtype=torch.float64)
    return (base + sd * torch.randn(len(base), generator=g, dtype=torch.float64)).tolist()


def test_a_noisy_plateau_stops_and_a_noisy_descent_goes_on():
    rule = Convergence(window=200, tolerance=1e-3, patience=2, decays=0)
    size = 1000  # the threshold: 1 nat per window on the full-data scale
    steps = torch.arange(2000, dtype=torch.float64)
    # Noise of sd 5 on a loss near 1,000: single steps differ by far more than the threshold.
    plateau = _noisy(torch.full((2000,), 1000.0))
    assert rule.converged(plateau, size)
    # Falling by 2 per 100 steps (4 per window): every window improves beyond the threshold.
    descent = _noisy(1000.0 - 0.02 * steps)
    assert not rule.converged(descent, size)
    # Levelling off: falling until step 1200, flat after; stalled from the windows after it.
    bend = _noisy(1000.0 - 0.05 * steps.clamp(max=1200))
    assert not rule.converged(bend[:1200], size) and rule.converged(bend, size)
    assert not rule.converged(plateau[:599], size)  # three complete windows are needed


def test_the_threshold_is_per_example_and_blind_to_a_constant():
    rule = Convergence(window=200, tolerance=1e-3, patience=2, decays=0)
    steps = torch.arange(2000, dtype=torch.float64)
    descent = 1000.0 - 0.02 * steps  # 4 nats per window
    # An ELBO with a large constant (MC dropout's -n log sigma) plateaus where the plain one
    # does: the threshold does not grow with |L|.
    for curve in (descent, torch.full((2000,), 1000.0), 1000.0 - 0.05 * steps.clamp(max=1200)):
        assert rule.plateaus(_noisy(curve), 1000) == rule.plateaus(_noisy(curve + 1e7), 1000)
    # 4 nats per window is progress on 1,000 examples (> 1) and a stall on 10,000 (< 10).
    assert not rule.converged(_noisy(descent), 1000) and rule.converged(_noisy(descent), 10_000)


def test_plateaus_cut_the_rate_before_the_last_one_ends_the_fit():
    rule = Convergence(window=100, tolerance=1e-3, patience=2, decays=2, factor=0.5)
    # Flat, then a drop (a rate cut lets the parameters settle), flat, a drop, flat.
    levels = [1000.0] * 500 + [990.0] * 500 + [985.0] * 500
    found = rule.plateaus(_noisy(levels, sd=1.0), 1000)
    # Each plateau is two stalled windows counted afresh: windows 1-2, 3-4, (the drop into
    # window 5 is an improvement) 6-7, 8-9, 11-12, 13-14.
    assert found == [300, 500, 800, 1000, 1300, 1500]
    assert not rule.converged(levels[:300], 1000)  # one plateau: the rate is cut, not stopped
    tracker = ConvergenceTracker(rule, 1000)
    assert not tracker.update(_noisy(levels[:700], sd=1.0))  # two plateaus: two cuts
    assert tracker.cuts == [300, 500] and tracker.lr_factor(701) == 0.25
    assert tracker.update(_noisy(levels[:800], sd=1.0))  # the third plateau ends the fit
    assert tracker.cuts == [300, 500] and tracker.lr_factor(801) == 0.25


def test_options_are_checked():
    with pytest.raises(ValueError, match="window must be an int >= 1"):
        Convergence(window=0)
    with pytest.raises(ValueError, match="tolerance must be >= 0"):
        Convergence(tolerance=-1)
    with pytest.raises(ValueError, match="decays must be an int >= 0"):
        Convergence(decays=-1)
    with pytest.raises(ValueError, match=r"factor must lie in \(0, 1\]"):
        Convergence(factor=0.0)
    with pytest.raises(ValueError, match="'auto' or a zoo.Convergence, got 'forever'"):
        resolve("forever")
    assert resolve("auto") == (Convergence().cap, Convergence())
    assert resolve(300) == (300, None)


def _fit(num_steps, **options):
    x, y = correlated_data(n=300, d=3, corr=0.5)
    fit_options = {**MEAN_FIELD_FIT, "batch_size": 300, "progress": False, **options}
    return zoo.fit(
        model_for(3), MEAN_FIELD_GUIDE, (x, y), num_steps=num_steps, **grouped(fit_options)
    )


@pytest.mark.slow  # quick tier: under three minutes
def test_auto_cuts_the_rate_then_stops_a_converged_fit_and_says_why():
    rule = Convergence(window=100, tolerance=1e-3, patience=2, cap=5000)
    fit = _fit(rule)
    assert fit.options["stopped"] == "converged"
    assert fit.steps == fit.options["stopped_at"] < 5000 and fit.steps % 100 == 0
    assert rule.converged(fit.losses, 300) and not rule.converged(fit.losses[:-100], 300)
    (cut,) = fit.options["lr_cuts"]  # one cut (decays=1), at the first plateau
    assert rule.plateaus(fit.losses, 300)[0] == cut < fit.steps
    # The cut changes the rate from the next step: the same fit without it (factor 1) takes
    # the same steps up to there and other steps after.
    same = _fit(Convergence(window=100, tolerance=1e-3, patience=2, cap=cut + 50, factor=1.0))
    assert same.losses[: cut + 1] == fit.losses[: cut + 1]
    assert same.losses[cut + 1 : cut + 50] != fit.losses[cut + 1 : cut + 50]
    short = _fit(40)
    assert short.options["stopped"] == "num_steps" and short.options["plateau_at"] is None
    fixed = _fit(2000)  # a fixed length: where the default rule would have cut the rate
    assert fixed.options["plateau_at"] == Convergence().plateaus(fixed.losses, 300)[0] < 2000


def test_the_cap_holds():
    fit = _fit(Convergence(window=50, tolerance=0.0, cap=120))  # nothing ever stalls
    assert fit.steps == 120 and fit.options["stopped"] == "cap"


@pytest.mark.slow  # quick tier: under three minutes
def test_a_resumed_fit_keeps_its_windows_and_its_rate(tmp_path):
    rule = Convergence(window=100, tolerance=1e-3, patience=2, cap=5000)
    whole = _fit(rule)
    (cut,) = whole.options["lr_cuts"]
    path = tmp_path / "fit.ckpt"
    for stop in (cut - 50, cut, cut + 50):  # before the rate cut, at it, after it
        part = _fit(rule, checkpoint=path, checkpoint_every=50, callbacks=[_stop_at(stop)])
        assert part.steps == stop and part.options["stopped"] == "callback"
        resumed = _fit(rule, checkpoint=path, checkpoint_every=50, resume=path)
        assert resumed.steps == whole.steps and resumed.options["stopped"] == "converged"
        assert resumed.losses == whole.losses and resumed.options["lr_cuts"] == [cut]
        path.unlink()


def _stop_at(step: int):
    return lambda state: state.step == step


def test_auto_keeps_the_small_regression_recipe_at_a_constant_rate():
    x, y = zoo.data.toy_regression(n=64)
    rule = Convergence(window=20, patience=1, tolerance=0.5, cap=400)  # stops soon
    fit = zoo.fit(
        zoo.models.BayesianMLP(1, (8,)),
        "diagonal",
        (x, y),
        num_steps=rule,
        run=zoo.Run(progress=False),
    )
    assert fit.options["recipe"] == "small regression data, length auto"
    assert fit.options["batch_size"] == 64 and fit.options["lr"] == 1e-2
    assert fit.options["stopped"] == "converged" and fit.steps < 400
