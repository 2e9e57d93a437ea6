import math

import pyro
import pytest
import torch

import guides
import zoo
import zoo.training.divergence
from tests.zoo.linear_gaussian import (
    correlated_data,
    decaying,
    exact_posterior,
    model_for,
)
from zoo.models import BayesianMLP


@pytest.mark.parametrize("batch_size", [100, 1000], ids=["minibatch", "full_batch"])
def test_diagonal_reaches_the_exact_mean_field_optimum(batch_size):
    """For a Gaussian posterior the mean-field optimum has the exact posterior mean and
    variances 1 / diag(precision). Minibatches must reach the same point: this pins the
    N / B scaling of the likelihood."""
    x, y = correlated_data(n=1000, d=3, corr=0.8)
    mean, precision = exact_posterior(x, y)
    fit = zoo.fit(
        model_for(3),
        guides.family("diagonal", init_scale=0.05),
        (x, y),
        num_steps=3000,
        batch_size=batch_size,
        lr=0.03,
        optim=zoo.Optim(lr_schedule=decaying),
        run=zoo.Run(progress=False),
    )
    medians = fit.guide.median()
    got_mean = torch.cat([medians["fc1.weight"].reshape(-1), medians["fc1.bias"]])
    post = [fit.guide.get_posterior(n) for n in ("fc1.weight", "fc1.bias")]
    got_var = torch.cat([p.variance.reshape(-1) for p in post]).detach()
    mf_var = 1 / precision.diagonal()
    assert ((got_mean - mean).abs() / mf_var.sqrt()).max() < 0.15
    assert ((got_var / mf_var) - 1).abs().max() < 0.15


def test_minibatch_loss_estimates_the_full_data_loss():
    """The per-step loss on a minibatch is unbiased for the full-batch loss."""
    x, y = correlated_data(n=400, d=3)
    model = model_for(3)
    fit = zoo.fit(
        model,
        "diagonal",
        (x, y),
        num_steps=1,
        batch_size=400,
        run=zoo.Run(progress=False),
    )
    guide = fit.guide
    scale = zoo.ElboScale()
    elbo = pyro.infer.TraceMeanField_ELBO(max_plate_nesting=1)
    with torch.no_grad():
        full = elbo.loss(scale(model), scale(guide), x, y)
        parts = []
        for start in range(0, 400, 50):
            scale.data_scale = 400 / 50
            parts.append(
                elbo.loss(scale(model), scale(guide), x[start : start + 50], y[start : start + 50])
            )
    full_mc = torch.tensor([elbo.loss(model, guide, x, y) for _ in range(200)]).mean()
    mini_mc = torch.tensor(parts).mean()
    # Averaged over the 8 disjoint batches, the N/B-scaled batch losses equal the full loss
    # up to the Monte Carlo noise of the likelihood term.
    assert abs(mini_mc - full_mc) / abs(full_mc) < 0.02
    assert abs(full - full_mc) / abs(full_mc) < 0.05


def test_kl_weight_scales_the_kl_term():
    x, y = correlated_data(n=200, d=3)
    model = model_for(3)
    fit = zoo.fit(
        model,
        "diagonal",
        (x, y),
        num_steps=1,
        batch_size=200,
        run=zoo.Run(progress=False),
    )
    elbo = pyro.infer.TraceMeanField_ELBO(max_plate_nesting=1)
    with torch.no_grad():
        pyro.set_rng_seed(1)
        l1 = elbo.loss(
            zoo.ElboScale(kl_weight=1.0)(model), zoo.ElboScale(kl_weight=1.0)(fit.guide), x, y
        )
        pyro.set_rng_seed(1)
        l0 = elbo.loss(
            zoo.ElboScale(kl_weight=0.0)(model), zoo.ElboScale(kl_weight=0.0)(fit.guide), x, y
        )
        pyro.set_rng_seed(1)
        lh = elbo.loss(
            zoo.ElboScale(kl_weight=0.5)(model), zoo.ElboScale(kl_weight=0.5)(fit.guide), x, y
        )
    kl = l1 - l0
    assert kl > 0
    assert abs((lh - l0) - 0.5 * kl) < 1e-6 * abs(l1)


def test_options_particles_meanfield_multipliers_schedule_callbacks():
    x = torch.randn(64, 3)
    y = torch.randint(0, 3, (64,))
    model = BayesianMLP(3, (8,), 3, task="classification")
    seen = []

    def stop_after_five(state):
        seen.append(state.step)
        return state.step >= 5

    fit = zoo.fit(
        model,
        "tridiagonal",
        (x, y),
        epochs=10,
        batch_size=16,
        loss=zoo.Loss(
            num_particles=4, elbo="meanfield", kl_weight=lambda step: min(1.0, 0.1 + step / 10)
        ),
        optim=zoo.Optim(
            lr_multipliers={"*.gamma*": 50.0},
            lr_schedule=lambda i: 1 / (1 + 1e-4 * i) ** 0.75,
            optimizer="sgd",
            optimizer_options={"momentum": 0.9},
        ),
        run=zoo.Run(callbacks=[stop_after_five], progress=False),
    )
    assert seen == [1, 2, 3, 4, 5] and fit.steps == 5
    assert fit.options["num_particles"] == 4


def test_lr_multiplier_reaches_its_parameters():
    x = torch.randn(32, 3)
    y = x.sum(-1)
    model = BayesianMLP(3, (4,), 1)
    fit = zoo.fit(
        model,
        "tridiagonal",
        (x, y),
        num_steps=1,
        lr=0.01,
        run=zoo.Run(progress=False),
        optim=zoo.Optim(lr_multipliers={"*.gamma*": 50.0}),
    )
    assert fit.steps == 1
    with pytest.raises(ValueError, match="match no parameter"):
        zoo.fit(
            model,
            "diagonal",
            (x, y),
            num_steps=1,
            run=zoo.Run(progress=False),
            optim=zoo.Optim(lr_multipliers={"*.gamma*": 50.0}),
        )


def test_seed_makes_fits_reproducible():
    x, y = correlated_data(n=100, d=2)
    a = zoo.fit(
        model_for(2),
        "lowrank",
        (x, y),
        num_steps=20,
        batch_size=10,
        run=zoo.Run(progress=False),
        seed=3,
    )
    b = zoo.fit(
        model_for(2),
        "lowrank",
        (x, y),
        num_steps=20,
        batch_size=10,
        run=zoo.Run(progress=False),
        seed=3,
    )
    assert a.losses == b.losses


def test_dataset_and_dataloader_inputs():
    x, y = torch.randn(40, 3), torch.randint(0, 2, (40,))
    ds = torch.utils.data.TensorDataset(x, y)

    class Plain(torch.utils.data.Dataset):
        def __len__(self):
            return 40

        def __getitem__(self, i):
            return x[i], y[i]

    model = BayesianMLP(3, (4,), 2, task="classification")
    for data in (ds, Plain(), torch.utils.data.DataLoader(Plain(), batch_size=8, shuffle=True)):
        fit = zoo.fit(
            model,
            "diagonal",
            data,
            epochs=1,
            batch_size=8,
            run=zoo.Run(progress=False),
        )
        assert fit.steps == 5 and len(fit.epoch_losses) == 1
        assert set(fit.evaluate(data, num_samples=5)) == {"accuracy", "nll", "brier", "ece"}


def test_evaluate_regression_metrics():
    x, y = correlated_data(n=200, d=2)
    fit = zoo.fit(
        model_for(2),
        "diagonal",
        (x, y),
        num_steps=300,
        batch_size=200,
        lr=0.05,
        run=zoo.Run(progress=False),
    )
    metrics = fit.evaluate((x, y), num_samples=50)
    assert metrics["rmse"] < 1.2
    assert 0.85 < metrics["coverage_95"] <= 1.0
    assert metrics["nll"] < 1.7


def test_divergence_stops_and_keeps_the_last_finite_parameters(monkeypatch):
    monkeypatch.setattr(zoo.training.divergence, "LAST_GOOD_EVERY", 1)
    x, y = torch.randn(20, 2), torch.randn(20)
    model = BayesianMLP(2, (3,), 1)
    snapshots = []

    def poison(state):
        snapshots.append(
            {k: v.detach().clone() for k, v in state.result.guide.state_dict().items()}
        )
        if state.step == 3:
            with torch.no_grad():
                x[0, 0] = float("nan")

    with pytest.raises(zoo.FitDivergedError, match="diverged at step 3") as err:
        zoo.fit(
            model,
            "diagonal",
            (x, y),
            num_steps=10,
            batch_size=20,
            run=zoo.Run(progress=False, callbacks=[poison]),
        )
    result = err.value.result
    assert result.steps == 3
    assert "back at the parameters of step 2" in str(err.value)
    # snapshots[i] holds the parameters after i + 1 updates; the loss at those of step 2 (the
    # last finite one) was computed after two updates.
    final = result.guide.state_dict()
    for k, v in snapshots[1].items():
        assert torch.equal(final[k], v)
    assert all(torch.isfinite(p).all() for p in result.guide.parameters())


@pytest.mark.parametrize(
    "num_steps, phrase",
    [(20, "diverged at step 1"), (1, r"after the last update \(step 0\) give a non-finite")],
    ids=["next_step", "last_update"],
)
def test_divergence_caused_by_the_parameters_restores_usable_ones(num_steps, phrase):
    """A huge SGD step leaves finite parameters whose loss is NaN (scales underflow to zero):
    the guide must come back to the parameters of the last finite loss, which still predict.
    When that update is the fit's last, the check after the loop catches it."""
    torch.manual_seed(0)
    x = torch.randn(64, 3)
    y = x.sum(1) + 0.1 * torch.randn(64)
    model = BayesianMLP(3, (16,), 1)
    guide = guides.AutoDiagonal(model)
    with torch.no_grad():
        guide(x, y)
    initial = {k: v.detach().clone() for k, v in guide.state_dict().items()}
    with pytest.raises(zoo.FitDivergedError, match=phrase) as err:
        zoo.fit(
            model,
            guide,
            (x, y),
            num_steps=num_steps,
            optim=zoo.Optim(optimizer="sgd"),
            run=zoo.Run(progress=False),
            lr=1e3,
        )
    result = err.value.result
    for k, v in result.guide.state_dict().items():
        assert torch.equal(v, initial[k]), k  # step 0's parameters: the last finite loss
    pred = result.predict(x, num_samples=5)
    assert torch.isfinite(pred.mean).all()


def test_non_finite_parameters_are_refused_before_training():
    x, y = torch.randn(20, 2), torch.randn(20)
    model = BayesianMLP(2, (3,), 1)
    guide = guides.AutoDiagonal(model)
    with torch.no_grad():
        guide(x, y)
        guide.site_posterior("fc1.weight").loc[0, 0] = float("inf")
    with pytest.raises(ValueError, match=r"\['sites.fc1.weight.loc'\] hold NaN or infinite"):
        zoo.fit(
            model,
            guide,
            (x, y),
            num_steps=5,
            run=zoo.Run(progress=False),
        )


def fit_skipping(x, y, guide, poison, num_steps):
    return zoo.fit(
        guide.model,
        guide,
        (x, y),
        num_steps=num_steps,
        batch_size=len(x),
        run=zoo.Run(progress=False, on_divergence="skip", callbacks=[poison]),
    )


def test_skip_goes_on_from_the_last_finite_parameters_and_reports_the_skipped_steps():
    x, y = torch.randn(20, 2), torch.randn(20)
    clean = x.clone()
    guide = guides.AutoDiagonal(BayesianMLP(2, (3,), 1))
    with torch.no_grad():
        guide(x, y)
    initial = {k: v.clone() for k, v in guide.state_dict().items()}
    seen, after_skips = [], []

    def poison(state):
        seen.append(state.loss)
        if not math.isfinite(state.loss):
            after_skips.append({k: v.clone() for k, v in guide.state_dict().items()})
        with torch.no_grad():
            x.copy_(clean)
            if state.step in (3, 4):
                x[0, 0] = float("nan")

    with pytest.warns(RuntimeWarning, match="2 of 10 steps were skipped"):
        result = fit_skipping(x, y, guide, poison, num_steps=10)
    assert result.skipped_steps == [3, 4]
    assert result.steps == 8 and all(math.isfinite(v) for v in result.losses)
    assert sum(not math.isfinite(v) for v in seen) == 2
    # The copy is taken every LAST_GOOD_EVERY (10) finite steps: both skips go back to step 0's.
    assert len(after_skips) == 2
    for state in after_skips:
        assert all(torch.equal(state[k], initial[k]) for k in initial)
    assert all(torch.isfinite(p).all() for p in result.guide.parameters())


def test_skip_gives_up_after_too_many_non_finite_steps_in_a_row(monkeypatch):
    monkeypatch.setattr(zoo.training.divergence, "MAX_CONSECUTIVE_SKIPS", 4)
    x, y = torch.randn(20, 2), torch.randn(20)
    guide = guides.AutoDiagonal(BayesianMLP(2, (3,), 1))

    def poison(state):
        if state.step == 2:
            with torch.no_grad():
                x[0, 0] = float("nan")

    with pytest.raises(zoo.FitDivergedError, match="4 steps in a row"):
        fit_skipping(x, y, guide, poison, num_steps=50)


def test_named_lr_schedules_follow_the_run_length():
    """``lr_schedule="exponential"`` is ``0.1 ** (step / total)`` over the run's own steps;
    ``"cosine"`` falls from 1 to 0.01; an unknown name fails before training."""
    from zoo.training.optim import resolve_schedule

    x, y = correlated_data(n=64, d=3)
    kwargs = dict(num_steps=40, batch_size=16, lr=0.01, seed=0, run=zoo.Run(progress=False))
    named = zoo.fit(
        model_for(3), "diagonal", (x, y), optim=zoo.Optim(lr_schedule="exponential"), **kwargs
    )
    manual = zoo.fit(
        model_for(3),
        "diagonal",
        (x, y),
        optim=zoo.Optim(lr_schedule=lambda i: 0.1 ** (i / 40)),
        **kwargs,
    )
    a, b = named.guide.median(), manual.guide.median()
    assert all(torch.equal(a[k], b[k]) for k in a)
    cosine = resolve_schedule("cosine", 100)
    assert cosine(0) == pytest.approx(1.0) and cosine(100) == pytest.approx(0.01)
    assert cosine(50) == pytest.approx(0.505)
    with pytest.raises(ValueError, match="lr_schedule must be"):
        zoo.fit(model_for(3), "diagonal", (x, y), optim=zoo.Optim(lr_schedule="linear"), **kwargs)
