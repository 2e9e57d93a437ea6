"""One interface for every kind of posterior (zoo.results): each kind the library returns, and
draws made elsewhere, answers predict, evaluate, sample, to_arviz and save/load the same way,
checked in one parametrised body whose kinds come from the loader's table; evaluate is the
metrics of predict's draws; from_draws predicts exactly as the posterior the draws came from."""

import math

import numpy as np
import pytest
import torch

import guides
import zoo
from zoo.results.loading import READERS

pytest.importorskip("laplace")


def classification(n=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g)
    return x, (x[:, 0] + 0.5 * x[:, 1] > 0).long()


def classifier():
    return zoo.models.BayesianMLP(3, (6,), 2, task="classification")


QUIET = zoo.Run(progress=False)


def reference_of(model, chains=2, draws=10, seed=0):
    """A small ``Reference`` made of given draws and statistics (no sampler run): the kind's
    calls do not depend on how the draws were made."""
    g = torch.Generator().manual_seed(seed)
    sites = {
        n: 0.3 * torch.randn(chains, draws, *s, generator=g) for n, s in model.site_shapes.items()
    }
    names = ("diverging", "tree_depth", "step_size", "energy", "lp", "acceptance_rate")
    stats = {n: torch.rand(chains, draws, generator=g) for n in names}
    stats["diverging"] = torch.zeros(chains, draws)
    return zoo.Reference(model, sites, stats, 1.0, {"chains": chains}, torch.device("cpu"))


def make(kind: str):
    """A posterior of ``kind`` (a row of zoo.load's table) on :func:`classification`."""
    data = classification()
    if kind == "fit":
        return zoo.fit(classifier(), "diagonal", data, num_steps=20, run=QUIET)
    if kind == "ensemble":
        return zoo.ensemble(classifier, data, members=2, family="diagonal", num_steps=10,
                            progress=False)  # fmt: skip
    if kind == "laplace":
        return zoo.laplace(classifier(), data, num_steps=30, progress=False)
    if kind == "reference":
        return reference_of(classifier())
    if kind == "draws":
        fit = zoo.fit(classifier(), "diagonal", data, num_steps=20, run=QUIET)
        return zoo.from_draws(fit.model, fit.sample(16, seed=3), label="a fit's draws")
    raise AssertionError(kind)


@pytest.fixture(scope="module", params=sorted(READERS))
def posterior(request):
    return make(request.param)


def test_the_loader_table_is_every_kind():
    kinds = {cls.kind for cls in (zoo.FitResult, zoo.Reference, zoo.Ensemble, zoo.LaplaceFit,
                                  zoo.Draws)}  # fmt: skip
    assert kinds == set(READERS)


def test_every_kind_is_a_posterior_with_one_body_per_call(posterior):
    assert isinstance(posterior, zoo.Posterior)
    for call in ("predict", "evaluate", "to_arviz", "save"):  # written once, never overridden
        assert getattr(type(posterior), call) is getattr(zoo.Posterior, call), call


def test_predict_gives_the_kinds_draws_and_is_seeded(posterior):
    x, _ = classification(10, seed=1)
    pred = posterior.predict(x, num_samples=8, progress=False)
    assert isinstance(pred, zoo.ClassificationPrediction)
    assert pred.outputs.shape[1:] == (10, 2)
    again = posterior.predict(x, num_samples=8, progress=False)
    assert torch.equal(pred.outputs, again.outputs)  # seed 0 by default: one call, one answer
    assert torch.allclose(pred.probs.sum(-1), torch.ones(10))


def test_evaluate_is_the_likelihoods_metrics_of_predict(posterior):
    x, y = classification(30, seed=2)
    metrics = posterior.evaluate((x, y), num_samples=6, seed=5, progress=False)
    pred = posterior.predict(x, num_samples=6, seed=5, progress=False)
    want = posterior.model.likelihood.metrics(pred, y)
    assert metrics == pytest.approx(want)
    assert {"accuracy", "nll", "brier", "ece"} <= set(metrics)


def test_sample_has_every_site_of_the_model(posterior):
    draws = posterior.sample(4, seed=1)
    shapes = posterior.model.site_shapes
    assert set(draws) == set(shapes)
    counts = {v.shape[0] for v in draws.values()}
    assert len(counts) == 1
    for name, value in draws.items():
        assert tuple(value.shape[1:]) == tuple(shapes[name])
        assert torch.isfinite(value).all()


def test_to_arviz_has_the_draws_and_their_likelihoods(posterior):
    pytest.importorskip("arviz")
    x, y = classification(12, seed=4)
    idata = posterior.to_arviz((x, y), num_samples=8, seed=1, progress=False)
    chains = posterior.chains(8, seed=1)
    c, d = next(iter(chains.values())).shape[:2]
    assert set(idata.posterior.data_vars) == set(posterior.model.site_shapes)
    for name, value in chains.items():
        np.testing.assert_array_equal(idata.posterior[name].values, value.numpy())
    assert idata.log_likelihood["obs"].shape == (c, d, 12)
    flat = {k: v.reshape(c * d, *v.shape[2:]) for k, v in chains.items()}
    want = posterior.predict_draws(x, flat).log_likelihood(y).reshape(c, d, 12)
    np.testing.assert_allclose(idata.log_likelihood["obs"].values, want.numpy(), atol=1e-5)
    from zoo.evaluation.arviz import groups_of

    assert ("sample_stats" in groups_of(idata)) == (posterior.kind == "reference")


def test_save_and_load_give_the_same_predictions(posterior, tmp_path):
    x, _ = classification(9, seed=6)
    path = posterior.save(tmp_path / "p.pt")
    back = zoo.load(path)
    assert type(back) is type(posterior)
    before = posterior.predict(x, num_samples=6, progress=False).outputs
    after = back.predict(x, num_samples=6, progress=False).outputs
    torch.testing.assert_close(after, before)


def test_bad_prediction_arguments_are_refused_before_work(posterior):
    x, _ = classification(4)
    for bad in ({"num_samples": 0}, {"num_samples": 2.5}, {"seed": -1}, {"progress": "no"}):
        with pytest.raises(ValueError):
            posterior.predict(x, **bad)


def test_an_unknown_drawing_keyword_is_refused_by_name_before_work(posterior):
    """predict, evaluate and to_arviz share their drawing options (zoo.results.contract.Drawing)
    as keywords: a misspelt one is refused naming the method and the options it takes."""
    x, y = classification(4)
    calls = {
        "predict": lambda **kw: posterior.predict(x, 2, **kw),
        "evaluate": lambda **kw: posterior.evaluate((x, y), 2, **kw),
        "to_arviz": lambda **kw: posterior.to_arviz(None, 2, **kw),
    }
    for name, call in calls.items():
        with pytest.raises(TypeError, match=rf"{name}\(\) got .*\['seeed'\].*'seed'"):
            call(seeed=1, progress=False)
    first = posterior.predict(x, 2, seed=3, progress=False, threads=1).outputs
    torch.testing.assert_close(posterior.predict(x, 2, seed=3, progress=False).outputs, first)


def test_sample_size_is_the_kinds_default_or_the_given_number_checked(posterior):
    if posterior.DEFAULT_SAMPLES is None:  # every draw it holds: no default number
        with pytest.raises(ValueError, match="no default number of draws: pass one"):
            posterior.sample_size(None, 0)
    else:
        assert posterior.sample_size(None, 0) == posterior.DEFAULT_SAMPLES
    assert posterior.sample_size(7, None) == 7
    for num_samples, seed in ((0, 0), (2.5, 0), (3, -1)):
        with pytest.raises(ValueError):
            posterior.sample_size(num_samples, seed)


def test_from_draws_predicts_as_the_posterior_it_came_from():
    """The draws of a fit, given back as a posterior, give the fit's own prediction (an
    independent path: the fit samples its guide, the draws are evaluated as given)."""
    data = classification()
    fit = zoo.fit(classifier(), "lowrank", data, num_steps=20, run=QUIET)
    x, y = classification(20, seed=7)
    draws = fit.sample(12, seed=9)
    given = zoo.from_draws(fit.model, {k: v.numpy() for k, v in draws.items()})
    torch.testing.assert_close(
        given.predict(x, progress=False).outputs,
        fit.predict(x, num_samples=12, seed=9, progress=False).outputs,
    )
    assert given.evaluate((x, y), progress=False) == pytest.approx(
        fit.evaluate((x, y), num_samples=12, seed=9, progress=False)
    )
    in_chains = {k: v.reshape(3, 4, *v.shape[1:]) for k, v in draws.items()}
    chained = zoo.from_draws(fit.model, in_chains, chains=True)
    assert chained.shape == (3, 4)
    torch.testing.assert_close(chained.predict(x, progress=False).outputs,
                               given.predict(x, progress=False).outputs)  # fmt: skip


def test_from_draws_refuses_what_cannot_be_the_models_draws():
    model = classifier()
    good = {n: torch.zeros(5, *s) for n, s in model.site_shapes.items()}
    name = next(iter(good))
    cases = [
        ({k: v for k, v in good.items() if k != name}, "missing"),
        ({**good, "extra": torch.zeros(5, 2)}, "unknown"),
        ({**good, name: torch.zeros(5, 99)}, "has shape"),
        ({**good, name: good[name].clone().fill_(math.nan)}, "not finite"),
        ({**good, name: good[name].long()}, "floating-point"),
        ({**good, name: good[name][:3]}, "same positive number"),
    ]
    for draws, message in cases:
        with pytest.raises((TypeError, ValueError), match=message):
            zoo.from_draws(model, draws)
    with pytest.raises(TypeError, match="zoo model"):
        zoo.from_draws(lambda x, y=None: None, good)
    with pytest.raises(ValueError, match="has shape"):
        zoo.from_draws(model, good, chains=True)  # (S, ...) is not (C, D, ...)
    with pytest.raises(ValueError, match="True or False"):
        zoo.from_draws(model, good, chains="yes")


def test_compare_takes_fitted_posteriors_as_rows():
    """A dict of posteriors is tabulated without refitting: each row's metrics are its own
    evaluate's (seed 0), its fit time and ELBO are its own."""
    pytest.importorskip("pandas")
    data = classification()
    fit = zoo.fit(classifier(), "diagonal", data, num_steps=20, run=QUIET)
    ens = zoo.ensemble(classifier, data, members=2, num_steps=10, progress=False)
    draws = zoo.from_draws(fit.model, fit.sample(8, seed=1), label="thinned")
    rows = {"diagonal": fit, "2 MAP nets": ens, "draws": draws}
    table = zoo.compare(None, rows, test=data, num_samples=8, progress=False)
    assert list(table.index) == list(rows)
    for label, post in rows.items():
        want = post.evaluate(data, num_samples=8, progress=False)
        for metric, value in want.items():
            assert table.loc[label, metric] == pytest.approx(value), (label, metric)
    assert table.loc["diagonal", "final_elbo"] == pytest.approx(fit.final_elbo)
    assert math.isnan(table.loc["draws", "final_elbo"])
    mixed = zoo.compare(classifier, [("fitted", fit), "map"], data, data, num_samples=4,
                        num_steps=5, progress=False)  # fmt: skip
    assert list(mixed.index) == ["fitted", "map"]
    with pytest.raises(ValueError, match="another model"):
        other = zoo.fit(zoo.models.BayesianMLP(3, (5,), 2, task="classification"), "map",
                        data, num_steps=2, run=QUIET)  # fmt: skip
        zoo.compare(None, {"a": fit, "b": other}, test=data, progress=False)
    with pytest.raises(ValueError, match="train data"):
        zoo.compare(classifier, ["diagonal"], test=data)


@pytest.mark.parametrize(
    "call",
    [
        lambda **kw: zoo.fit(classifier(), "map", classification(), **kw),
        lambda **kw: zoo.ensemble(classifier, classification(), **kw),
        lambda **kw: zoo.laplace(classifier(), classification(), **kw),
        lambda **kw: zoo.compare(classifier, ["map"], classification(), classification(), **kw),
    ],
    ids=["fit", "ensemble", "laplace", "compare"],
)
def test_every_producer_binds_options_as_fit_does(call):
    """A group's field passed flat is refused with fit's message, naming the group; an unknown
    name is Python's own refusal, before any fit."""
    with pytest.raises(TypeError, match=r"takes its options in groups: pass jit= in "
                                        r"engine=zoo.Engine\(jit=...\)"):  # fmt: skip
        call(jit=False)
    with pytest.raises(TypeError, match="unexpected keyword argument 'member'"):
        call(member=2)


def test_compare_refuses_what_it_cannot_tabulate_before_any_fit():
    data = classification()
    fit = zoo.fit(classifier(), "diagonal", data, num_steps=2, run=QUIET)
    with pytest.raises(ValueError, match="labels must be unique"):
        zoo.compare(None, [("a", fit), ("a", fit)], test=data, progress=False)
    with pytest.raises(ValueError, match="unknown family 'diagnoal'.*'ensemble' or 'laplace'"):
        zoo.compare(classifier, [("first", fit), "diagnoal"], data, data, progress=False)


def test_a_silent_ensemble_prints_nothing(capfd):
    """``progress=False`` silences the bar over the members and every member's own."""
    zoo.ensemble(classifier, classification(), members=2, num_steps=3, progress=False)
    assert capfd.readouterr().err == ""


def test_compare_says_what_each_elbo_bounds():
    """Only rows labelled "model's ELBO" bound the same number: the point mass's is a log joint,
    WHVI's its own model's, a subnetwork's is conditional on its point masses, MC dropout's has
    a degenerate q; baselines and draws have none."""
    pytest.importorskip("pandas")
    data = classification()
    rows = ["diagonal", "map", "whvi", "mc_dropout", ("subnetwork S=5", "subnetwork", {"size": 5}),
            ("last layer", "mixed", {"families": {"fc2.*": "lowrank", "*": "map"}}),
            ("2 MAP nets", "ensemble", {"members": 2})]  # fmt: skip
    table = zoo.compare(classifier, rows, data, data, num_samples=2, num_steps=3, progress=False)
    assert dict(table["objective"]) == {
        "diagonal": "model's ELBO",
        "map": "log joint (MAP), no bound",
        "whvi": "ELBO of WHVI's own model",
        "mc_dropout": "MC dropout's ELBO",
        "subnetwork S=5": "ELBO given point masses",
        "last layer": "ELBO given point masses",
        "2 MAP nets": "none",
    }
    every = sum(math.prod(s) for s in classifier().site_shapes.values())
    net = classifier()
    joint = zoo.fit(net, guides.AutoJoint(net), data, num_steps=2, run=QUIET)
    assert joint.objective == "model"  # every scalar in the Gaussian
    whole = guides.family("subnetwork", size=every)  # a subnetwork of every weight: the same
    assert zoo.fit(classifier(), whole, data, num_steps=2, run=QUIET).objective == "model"


def test_every_kind_holds_the_parts_of_a_posterior(posterior):
    from zoo.results.contract import KINDS, PosteriorParts

    assert isinstance(posterior, PosteriorParts)
    assert KINDS[posterior.kind] is type(posterior)
    assert isinstance(posterior.device, torch.device)
    assert isinstance(posterior.wall_time, float) or isinstance(posterior.wall_time, int)


def test_a_new_kind_is_one_class_statement(tmp_path, monkeypatch):
    """A kind registered by its class statement is read by zoo.load at once; a kind another
    class holds, or a name that is not an identifier, is refused."""
    from zoo.results import contract

    monkeypatch.setattr(contract, "KINDS", dict(contract.KINDS))

    class Constant(zoo.Posterior, kind="constant_for_a_test"):
        def __init__(self, model, value):
            self.model, self.value = model, value
            self.device, self.options, self.wall_time = torch.device("cpu"), {}, 0.0

        def payload(self):
            return {"value": torch.tensor(self.value)}

        @classmethod
        def read(cls, payload, path, model, map_location):
            return cls(model, float(payload["value"]))

    path = tmp_path / "c.pt"
    Constant(classifier(), 2.5).save(path)
    back = zoo.load(path, model=classifier())
    assert isinstance(back, Constant) and back.value == 2.5
    with pytest.raises(ValueError, match="is .*Constant's already"):

        class Other(zoo.Posterior, kind="constant_for_a_test"):
            pass

    with pytest.raises(ValueError, match="identifier"):

        class Bad(zoo.Posterior, kind="not a name"):
            pass


def test_a_kind_claimed_twice_is_refused_naming_both_classes(monkeypatch):
    """A user's ``class FitResult(zoo.Posterior, kind="fit")`` does not become the reader of
    every fit file: the claim is refused naming both classes, and ``fit`` stays the library's;
    the same class defined again in its own module (a reload) takes its place."""
    import types

    from zoo.results import contract
    from zoo.results.variational import FitResult as Library

    monkeypatch.setattr(contract, "KINDS", dict(contract.KINDS))
    with pytest.raises(ValueError) as caught:

        class FitResult(zoo.Posterior, kind="fit"):
            pass

    message = str(caught.value)
    assert "zoo.results.variational.FitResult" in message
    assert f"{__name__}.test_a_kind_claimed_twice" in message and "kind of its own" in message
    assert contract.KINDS["fit"] is Library
    source = "import zoo\nclass Mine(zoo.Posterior, kind='reloaded_for_a_test'):\n    pass\n"
    first, again = types.ModuleType("plugin_for_a_test"), types.ModuleType("plugin_for_a_test")
    exec(compile(source, "plugin.py", "exec"), first.__dict__)
    exec(compile(source, "plugin.py", "exec"), again.__dict__)
    assert contract.KINDS["reloaded_for_a_test"] is again.Mine is not first.Mine


@pytest.mark.parametrize("task", ["classification", "regression"])
def test_non_finite_network_outputs_are_refused_naming_the_draw_and_input(task):
    """A network whose forward gives NaN at some inputs: predict and evaluate say so, naming
    the first (draw, input), instead of Pyro's constraint error on the logits."""

    class Overflows(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(3, 2 if task == "classification" else 1)

        def forward(self, x):
            out = self.fc(x)
            return torch.where(x[:, :1] > 1.5, torch.full_like(out, float("nan")), out)

    torch.manual_seed(0)
    x = torch.randn(50, 3)
    y = torch.randint(0, 2, (50,)) if task == "classification" else torch.randn(50)
    model = zoo.models.from_module(Overflows(), task=task, init="fresh")
    fit = zoo.fit(model, "diagonal", (x.clamp(max=1.0), y), num_steps=2,
                  run=zoo.Run(progress=False))  # fmt: skip
    first = int((x[:, 0] > 1.5).nonzero()[0])
    phrase = rf"outputs hold NaN or infinite values .* the first: draw 0, input {first}\)"
    with pytest.raises(ValueError, match=phrase):
        fit.predict(x, num_samples=4)
    with pytest.raises(ValueError, match=phrase):
        fit.evaluate((x, y), num_samples=4)
