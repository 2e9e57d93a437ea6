import pytest
import torch

import zoo
from zoo.models.predictions import ClassificationPrediction, RegressionPrediction


def test_mutual_information_is_zero_when_samples_agree_and_positive_otherwise():
    same = torch.tensor([[0.7, 0.2, 0.1]]).expand(5, 1, 3)
    pred = ClassificationPrediction(same.log(), sample_probs=same)
    assert torch.allclose(pred.mutual_information, torch.zeros(1), atol=1e-6)
    assert torch.allclose(pred.entropy, pred.expected_entropy)
    differ = torch.tensor([[[0.98, 0.01, 0.01]], [[0.01, 0.98, 0.01]]])
    pred = ClassificationPrediction(differ.log(), sample_probs=differ)
    assert pred.mutual_information.item() > 0.5
    lower, upper = pred.class_intervals(0.9)
    assert (lower <= upper).all() and lower.shape == (1, 3)


def test_a_prediction_without_a_likelihood_says_so_when_asked_for_one():
    probs = torch.tensor([[0.7, 0.2, 0.1]]).expand(5, 1, 3)
    pred = ClassificationPrediction(probs.log(), sample_probs=probs)
    with pytest.raises(ValueError, match="holds no observation distribution"):
        pred.log_likelihood(torch.tensor([0]))


def test_regression_moments():
    means = torch.tensor([[0.0], [2.0]])
    scales = torch.tensor([[1.0], [1.0]])
    pred = RegressionPrediction(means, sample_means=means, sample_scales=scales)
    assert pred.mean.item() == 1.0
    assert pred.epistemic_variance.item() == 1.0 and pred.aleatoric_variance.item() == 1.0
    lo, hi = pred.interval(0.95)
    assert torch.allclose(hi - lo, torch.tensor([2 * 1.959964 * 2**0.5]), rtol=1e-5)


def test_progress_bar_appears_only_when_asked_and_after_the_delay(monkeypatch, capsys):
    import guides
    import zoo.evaluation.predictive
    from zoo.evaluation.predictive import predict
    from zoo.models import BayesianMLP

    model = BayesianMLP(2, (3,), 1)
    guide = guides.AutoDiagonal(model)
    x = torch.randn(10, 2)
    with torch.no_grad():
        guide(x, torch.randn(10))
    predict(model, guide, x, num_samples=4, batch_size=5)  # faster than the 2 s delay
    predict(model, guide, x, num_samples=4, batch_size=5, progress=False)
    assert "predict" not in capsys.readouterr().err
    monkeypatch.setattr(zoo.evaluation.predictive, "PROGRESS_DELAY", 0.0)
    pred = predict(model, guide, x, num_samples=4, batch_size=5)
    assert "predict" in capsys.readouterr().err  # 2 input blocks x 4 draws = 8 passes
    assert pred.outputs.shape[:2] == (4, 10)
    predict(model, guide, x, num_samples=4, batch_size=5, progress=False)
    assert capsys.readouterr().err == ""


def test_cpu_batch_size_bounds_the_largest_activation_of_a_pass(monkeypatch):
    import guides
    import zoo.evaluation.predictive
    from zoo.evaluation.predictive import cpu_batch_size, predict
    from zoo.models import BayesianMLP, LeNet5

    lenet = LeNet5()
    guide = guides.AutoDiagonal(lenet)
    x = torch.randn(7, 1, 28, 28)
    with torch.no_grad():
        guide(x[:2], torch.zeros(2, dtype=torch.long))
    draws = guide.sample_posterior(3)
    assert (
        zoo.evaluation.predictive.last_level_cache_bytes() >= 1 << 20
    )  # read from sysfs, or 32 MiB
    per_image = 20 * 24 * 24 * 4  # LeNet-5's largest activation: conv1's output, float32
    monkeypatch.setattr(
        zoo.evaluation.predictive, "last_level_cache_bytes", lambda: 3 * 100 * per_image
    )
    assert cpu_batch_size(lenet, x, draws) == 100
    assert cpu_batch_size(lenet, x[:1], draws) == 100  # one input is enough to measure
    monkeypatch.setattr(zoo.evaluation.predictive, "last_level_cache_bytes", lambda: 1)
    assert cpu_batch_size(lenet, x, draws) == zoo.evaluation.predictive.CPU_BATCH_RANGE[0]
    monkeypatch.setattr(zoo.evaluation.predictive, "last_level_cache_bytes", lambda: 1 << 40)
    assert (
        cpu_batch_size(lenet, x, draws) == zoo.evaluation.predictive.CPU_ACTIVATION_CAP // per_image
    )
    # Weights do not count: a wide MLP with tiny activations gets the upper bound.
    mlp = BayesianMLP(784, (400, 400), 10, task="classification")
    mlp_guide = guides.AutoDiagonal(mlp)
    with torch.no_grad():
        mlp_guide(torch.randn(2, 784), torch.zeros(2, dtype=torch.long))
    monkeypatch.setattr(zoo.evaluation.predictive, "last_level_cache_bytes", lambda: 32 << 20)
    mlp_draws = mlp_guide.sample_posterior(2)
    assert cpu_batch_size(mlp, torch.randn(5, 784), mlp_draws) == 4096
    # The batch size changes only how the work is split, not the result.
    auto = predict(lenet, guide, x, params=draws, progress=False).outputs
    split = predict(lenet, guide, x, params=draws, batch_size=2, progress=False).outputs
    torch.testing.assert_close(auto, split)


def test_predict_without_a_fitted_guide_says_so():
    import pytest

    import guides
    from zoo.evaluation.predictive import predict
    from zoo.models import BayesianMLP

    model = BayesianMLP(3, (4,), 1)
    x = torch.randn(5, 3)
    with pytest.raises(RuntimeError, match="has not been run yet"):
        predict(model, guides.AutoDiagonal(model), x)
    with pytest.raises(TypeError, match="needs a fitted guide.*not 'diagonal'"):
        predict(model, "diagonal", x)


@pytest.mark.parametrize("level", [95, 0, 1, -0.5, float("nan")])
def test_interval_levels_outside_zero_one_are_refused(level):
    reg = zoo.models.BayesianMLP(2, (4,), noise=1.0)
    x = torch.randn(8, 2)
    fit = zoo.fit(
        reg,
        "diagonal",
        (x, torch.randn(8)),
        num_steps=1,
        run=zoo.Run(progress=False),
    )
    with pytest.raises(ValueError, match="between 0 and 1"):
        fit.predict(x, 4, progress=False).interval(level)
    clf = zoo.models.BayesianMLP(2, (4,), 3, task="classification")
    fit = zoo.fit(
        clf,
        "diagonal",
        (x, torch.randint(0, 3, (8,))),
        num_steps=1,
        run=zoo.Run(progress=False),
    )
    with pytest.raises(ValueError, match="between 0 and 1"):
        fit.predict(x, 4, progress=False).class_intervals(level)


def test_fit_result_repr_is_a_few_lines():
    x = torch.randn(64, 2)
    fit = zoo.fit(
        zoo.models.BayesianMLP(2, (4,), 2, task="classification"),  # its rate is measured
        "diagonal",
        (x, (x[:, 0] > 0).long()),
        num_steps=500,
        batch_size=8,
        loss={"map_start": False},  # the family's own rate test (a MAP phase: its own repr)
        run=zoo.Run(progress=False),
    )
    text = repr(fit)
    assert len(text.splitlines()) <= 4 and len(text) < 400
    test = fit.options["lr_test"]["steps"]  # the default rate is measured, its steps charged
    assert f"steps={500 - test} after a rate test of {test}," in text
    assert "diagonal" in text and "BayesianMLP" in text


def test_a_cuda_device_without_a_gpu_is_a_sentence(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    x = torch.randn(8, 2)
    with pytest.raises(ValueError, match="no usable CUDA device"):
        zoo.fit(
            zoo.models.BayesianMLP(2, (4,), noise=1.0),
            "diagonal",
            (x, torch.randn(8)),
            num_steps=1,
            run=zoo.Run(progress=False),
            engine=zoo.Engine(device="cuda"),
        )


def test_prediction_arguments_are_checked_before_any_draw():
    import zoo as _zoo
    from zoo.models import BayesianMLP as _MLP

    x = torch.randn(20, 3)
    fit = _zoo.fit(_MLP(3, (4,), noise=1.0), "diagonal", (x, x[:, 0]), num_steps=2,
                   run=_zoo.Run(progress=False))  # fmt: skip
    for options, phrase in [
        (dict(batch_size=0), "batch_size must be a positive integer, got 0"),
        (dict(num_samples=2.5), "num_samples must be a positive integer, got 2.5"),
        (dict(sample_batch_size=-1), "sample_batch_size must be a positive integer"),
        (dict(seed="a"), "seed must be None"),
    ]:
        with pytest.raises(ValueError, match=phrase):
            fit.predict(x, progress=False, **options)
    with pytest.raises(ValueError, match="num_samples must be a positive integer, got 0"):
        fit.to_arviz(num_samples=0, progress=False)


def test_predict_is_seeded_by_default_as_evaluate_and_to_arviz_are():
    import zoo as _zoo
    from zoo.models import BayesianMLP as _MLP

    x = torch.randn(20, 3)
    fit = _zoo.fit(_MLP(3, (4,), noise=1.0), "diagonal", (x, x[:, 0]), num_steps=2,
                   run=_zoo.Run(progress=False))  # fmt: skip
    state = torch.get_rng_state()
    a = fit.predict(x, num_samples=5, progress=False).outputs
    b = fit.predict(x, num_samples=5, progress=False).outputs
    assert torch.equal(a, b) and torch.equal(torch.get_rng_state(), state)
    c = fit.predict(x, num_samples=5, progress=False, seed=None).outputs
    assert not torch.equal(a, c)


def test_an_empty_shard_builds_no_progress_bar_and_keeps_the_output_shape(monkeypatch):
    """A rank with no inputs (fewer inputs than ranks) returns ``(S, 0, ...)`` and leaves no
    progress bar open."""
    import guides
    import zoo.evaluation.predictive as predictive
    from zoo.models import BayesianMLP

    bars = []

    class Recorded(predictive.tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.closed_here = False
            bars.append(self)

        def close(self):
            self.closed_here = True
            super().close()

    monkeypatch.setattr(predictive, "tqdm", Recorded)
    model = BayesianMLP(2, (3,), 1)
    guide = guides.AutoDiagonal(model)
    x = torch.randn(10, 2)
    with torch.no_grad():
        guide(x, torch.randn(10))
        params = {k: torch.stack([guide()[k] for _ in range(4)]) for k in model.site_shapes}
    cpu = torch.device("cpu")
    empty = predictive._passes(model, x[:0], x, params, 4, 5, 2, cpu, True)
    assert empty.shape == (4, 0, 1) and bars == []
    full = predictive._passes(model, x, x, params, 4, 5, 2, cpu, True)
    assert full.shape == (4, 10, 1) and [b.closed_here for b in bars] == [True]
