import pyro
import pytest
import torch

import guides
import zoo
import zoo.runtime.threads
from zoo.models.lenet import LeNet5Network
from zoo.models.mlp import mlp_network
from zoo.training.options import grouped


def tiny_model():
    return zoo.models.BayesianModel(mlp_network(13, (50,), 1), task="regression", noise=1.0)


@pytest.fixture
def two_threads():
    """Torch at two intra-op threads during the test, the suite's setting back afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_forward_flops_counts_the_matrix_products_and_draws_nothing():
    """2 B (13 * 50 + 50 * 1) for a 13-50-1 MLP on B inputs, counted by hand; the count
    advances no random generator and records no Pyro site."""
    model, x, y = tiny_model(), torch.randn(32, 13), torch.randn(32)
    state = torch.random.get_rng_state()
    with pyro.poutine.trace() as tape:
        flops = zoo.runtime.threads.forward_flops(model, x, y)
    assert flops == 2 * 32 * (13 * 50 + 50 * 1)
    assert torch.equal(state, torch.random.get_rng_state())
    assert not [n for n, s in tape.trace.nodes.items() if s["type"] == "sample"]


def test_the_rule_gives_small_steps_one_thread_and_leaves_large_ones_alone():
    cpu = torch.device("cpu")
    small = zoo.runtime.threads.SMALL_STEP_FLOPS - 1
    assert zoo.runtime.threads.threads_for("auto", cpu, lambda: small) == 1
    assert zoo.runtime.threads.threads_for("auto", cpu, lambda: small + 1) is None
    assert zoo.runtime.threads.threads_for("auto", torch.device("cuda"), lambda: 0) is None
    assert zoo.runtime.threads.threads_for(3, cpu, lambda: 0) == 3
    assert zoo.runtime.threads.threads_for(None, cpu, lambda: 0) is None
    # The threshold sits between the tiny regression net and LeNet-5 on a batch of 128.
    lenet = zoo.models.BayesianModel(LeNet5Network(100))
    assert zoo.runtime.threads.forward_flops(lenet, torch.randn(128, 1, 28, 28)) > small


def fit_tiny(n: int = 32, **options):
    """The tiny model fitted on ``n`` random examples in batches of 32."""
    data = (torch.randn(n, 13), torch.randn(n))
    return zoo.fit(
        tiny_model(),
        "diagonal",
        data,
        batch_size=32,
        **grouped({**options, "run": zoo.Run(progress=False)}),
    )


def threads_seen(**options):
    """``(torch's thread count at each step, the fit)`` of :func:`fit_tiny`."""
    seen = []
    fit = fit_tiny(callbacks=[lambda state: seen.append(torch.get_num_threads())], **options)
    return seen, fit


def test_fit_runs_a_small_step_on_one_thread_and_restores_the_callers_count(two_threads):
    seen, fit = threads_seen(n=64, num_steps=3)
    assert seen == [1, 1, 1] and fit.options["threads"] == 1
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize("n, batch_size, expected", [(64, 32, 2), (64, 8, 1), (8, 32, 1)])
def test_the_rules_weigh_a_minibatch_not_the_two_example_probe(
    two_threads, monkeypatch, n, batch_size, expected
):
    """``zoo.fit`` sets its objective up on two examples, but the threads' size rule weighs the
    forward pass of a whole minibatch (the data's size when it is smaller than ``batch_size``):
    with the threshold at 16 examples of the 13-50-1 net (1,400 FLOP each), a minibatch of 32
    runs on torch's threads, one of 8 (or the 8 examples of a smaller data set) on one thread;
    both compile."""
    monkeypatch.setattr(zoo.runtime.threads, "SMALL_STEP_FLOPS", 16 * 1400)
    seen = []
    data = (torch.randn(n, 13), torch.randn(n))
    fit = zoo.fit(
        tiny_model(),
        "diagonal",
        data,
        batch_size=batch_size,
        num_steps=2,
        run=zoo.Run(progress=False, callbacks=[lambda s: seen.append(torch.get_num_threads())]),
    )
    assert seen == [expected] * 2
    assert fit.options["threads"] == expected
    assert fit.options["jit"] == "compiled"  # at any size


def test_the_objective_counts_a_minibatch_exactly_from_two_examples():
    """The count scaled from the two-example setup batch equals a count on the minibatch
    itself (LeNet-5 on 128 images: 504 MFLOP, over 60 times the two images' 7.9)."""
    model = zoo.models.LeNet5()
    x, y = torch.randn(128, 1, 28, 28), torch.randint(0, 10, (128,))
    objective = zoo.Objective(model, guides.AutoDiagonal(model), jit=False)
    objective.setup(x[:2], y[:2], batch_size=128)
    assert objective.forward_flops() == zoo.runtime.threads.forward_flops(model, x, y)
    assert objective.forward_flops() > 60 * zoo.runtime.threads.forward_flops(model, x[:2], y[:2])


def test_an_explicit_count_is_used_and_none_leaves_torchs_setting(two_threads):
    for threads, expected in ((1, 1), (None, 2), (2, 2)):
        seen, fit = threads_seen(num_steps=2, threads=threads)
        assert seen == [expected] * 2 and fit.options["threads"] == expected
        assert torch.get_num_threads() == 2


def test_the_callers_count_is_back_after_a_fit_that_raises(two_threads):
    def stop(state):
        raise RuntimeError("a callback failed")

    with pytest.raises(RuntimeError, match="a callback failed"):
        fit_tiny(num_steps=2, callbacks=[stop])
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize("threads", [0, -1, 1.5, "all", True])
def test_a_bad_thread_count_is_refused_before_training(threads):
    with pytest.raises(ValueError, match="threads must be 'auto', None or a positive int"):
        fit_tiny(num_steps=1, threads=threads)


def prediction_threads_seen(fit, call):
    """Torch's thread count during each prediction pass of ``call(fit)`` (its network, wrapped;
    the probes of two or three inputs of the checks and rules are not passes)."""
    seen, network = [], fit.model.network

    def counting(x, params):
        if x.shape[0] > 3:
            seen.append(torch.get_num_threads())
        return network(x, params)

    fit.model.network = counting
    try:
        call(fit)
    finally:
        del fit.model.network
    return seen


@pytest.mark.parametrize("route", ["predict", "evaluate", "to_arviz"])
def test_prediction_takes_the_fits_rule_and_restores_the_callers_count(two_threads, route):
    fit = fit_tiny(num_steps=2)
    x = torch.randn(40, 13)
    data = (x, torch.randn(40))
    calls = {
        "predict": lambda f, **kw: f.predict(x, num_samples=3, progress=False, **kw),
        "evaluate": lambda f, **kw: f.evaluate(data, num_samples=3, progress=False, **kw),
        "to_arviz": lambda f, **kw: f.to_arviz(data, num_samples=3, progress=False, **kw),
    }
    call = calls[route]
    seen = prediction_threads_seen(fit, call)  # "auto": a small pass, one thread
    assert seen and set(seen) == {1} and torch.get_num_threads() == 2
    for threads, expected in ((None, 2), (3, 3)):
        seen = prediction_threads_seen(fit, lambda f, t=threads: call(f, threads=t))
        assert set(seen) == {expected} and torch.get_num_threads() == 2
    with pytest.raises(ValueError, match="threads"):
        call(fit, threads=0)


def test_prediction_weighs_its_block_of_inputs(two_threads, monkeypatch):
    """The prediction rule weighs one pass over a block of ``batch_size`` inputs (here the
    threshold sits at 16 inputs of the 13-50-1 net): blocks of 32 run on torch's threads, blocks
    of 8 on one."""
    monkeypatch.setattr(zoo.runtime.threads, "SMALL_STEP_FLOPS", 16 * 1400)
    fit = fit_tiny(num_steps=2, threads=1)
    x = torch.randn(64, 13)
    for batch_size, expected in ((32, 2), (8, 1)):
        predict = lambda f, b=batch_size: f.predict(x, 2, batch_size=b, progress=False)  # noqa: E731
        assert set(prediction_threads_seen(fit, predict)) == {expected}


def test_a_large_prediction_pass_keeps_torchs_setting(two_threads, monkeypatch):
    monkeypatch.setattr(zoo.runtime.threads, "SMALL_STEP_FLOPS", 0)
    fit = fit_tiny(num_steps=2, threads=1)
    seen = prediction_threads_seen(fit, lambda f: f.predict(torch.randn(8, 13), 2, progress=False))
    assert set(seen) == {2}
