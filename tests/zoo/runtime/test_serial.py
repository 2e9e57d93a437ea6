"""Library calls from several threads (zoo.runtime.serial): each ends exactly as it would alone."""

import threading

import torch

import zoo
from zoo.models import BayesianMLP


def data(n=128):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 3, generator=g)
    return x, x[:, 0] - 2 * x[:, 1]


def one_fit(family, seed, callbacks=(), model=None):
    model = model or BayesianMLP(3, (16,), noise=1.0)
    return zoo.fit(
        model, family, data(), num_steps=60, batch_size=32, seed=seed,
        run=zoo.Run(progress=False, callbacks=callbacks),
    )  # fmt: skip


def params(result):
    return {k: v.detach().clone() for k, v in result.guide.state_dict().items()}


def in_threads(jobs):
    out, errors = [None] * len(jobs), []

    def run(i, job):
        try:
            out[i] = job()
        except BaseException as err:  # noqa: BLE001 (reported below)
            errors.append(err)

    threads = [threading.Thread(target=run, args=(i, job)) for i, job in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not any(t.is_alive() for t in threads), "a thread did not finish"
    assert not errors, errors
    return out


def test_fits_in_threads_equal_the_same_fits_run_alone():
    """Models are built before the threads start: torch's global generator is the one Pyro
    draws from, so a thread that draws from it (a model's initialisation) while a fit runs
    changes that fit's draws (zoo.runtime.serial)."""
    cases = [("diagonal", 0), ("lowrank", 1), ("diagonal", 2), ("tridiagonal", 3)]
    alone = [params(one_fit(f, s)) for f, s in cases]
    models = [BayesianMLP(3, (16,), noise=1.0) for _ in cases]
    threaded = in_threads(
        [lambda f=f, s=s, m=m: params(one_fit(f, s, model=m)) for (f, s), m in zip(cases, models)]
    )
    for a, b in zip(alone, threaded):
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), key


def test_predictions_in_threads_equal_the_same_predictions_alone():
    fit = one_fit("diagonal", 0)
    x = data(40)[0]
    alone = [fit.predict(x, num_samples=20, seed=s, progress=False).outputs for s in range(4)]
    threaded = in_threads(
        [lambda s=s: fit.predict(x, num_samples=20, seed=s, progress=False).outputs
         for s in range(4)]
    )  # fmt: skip
    for a, b in zip(alone, threaded):
        assert torch.equal(a, b)


def test_a_call_inside_a_fit_in_the_same_thread_does_not_wait():
    """The lock is re-entrant: a callback that predicts runs at once."""
    seen = []

    def callback(state):
        if state.step == 5:
            seen.append(state.result.predict(data(8)[0], num_samples=3, progress=False))

    in_threads([lambda: one_fit("diagonal", 0, callbacks=[callback])])
    assert len(seen) == 1
