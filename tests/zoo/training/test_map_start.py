"""zoo.training.map_start: a fit from scratch starts with a MAP phase inside the same budget."""

import pytest
import torch

import zoo
from tests.trained import blobs, trained_cnn
from tests.zoo.training.test_rate import classification, model
from zoo.training.map_start import MAP_SHARE, phase_path

QUIET = zoo.Run(progress=False)


def data():
    return classification(480)


def fit(guide="diagonal", net=None, **options):
    options.setdefault("num_steps", 120)
    options.setdefault("batch_size", 32)
    options.setdefault("run", QUIET)
    return zoo.fit(net if net is not None else model(), guide, data(), **options)


def test_a_default_fit_from_scratch_is_a_map_phase_then_the_family_in_one_budget():
    result = fit()
    phase = result.options["map_start"]
    assert phase["steps"] == round(MAP_SHARE * 120)  # the rate test's steps among them
    assert phase["lr_test"]["steps"] > 0 and phase["lr"] == phase["lr_test"]["lr"]
    assert phase["steps"] + result.steps == result.options["num_steps"] == 120
    assert result.fitting()["steps"] == 120
    assert result.options["recipe"].endswith(", MAP start")
    assert result.options["start"] == "fresh" and "MAP start" in result.options["start_rule"]
    assert f"after a MAP phase of {phase['steps']}" in repr(result)
    assert "lr_test" not in result.options  # the family's phase measured nothing itself


def test_the_phases_are_a_map_fit_and_the_family_from_its_weights():
    """Independently: the MAP default call stopped at its share, then the family fitted from a
    converted network holding the MAP weights (init="module"), at the rate the MAP phase's
    schedule reached, decaying on to a tenth: the same steps, loss for loss."""
    result = fit()
    net = model()
    stop_at = round(MAP_SHARE * 120)

    def stop(view):
        return view.step >= stop_at - view.result.options["lr_test"]["steps"]

    first = zoo.Run(progress=False, callbacks=[stop], statistics="running")
    point = zoo.fit(net, "map", data(), num_steps=120, batch_size=32, run=first)
    taken, left = point.steps, point.options["num_steps"]
    converted = model()
    converted.init = "module"  # its network's weights are the guide's means: the MAP's below
    with torch.no_grad():
        for name, value in point.guide.median().items():
            converted.net.get_parameter(name).copy_(value)
    by_hand = zoo.fit(
        converted, "diagonal", data(), num_steps=left - taken, batch_size=32,
        lr=point.options["lr"], optim={"lr_schedule": lambda t: 0.1 ** ((taken + t) / left)},
        loss={"map_start": False}, run=QUIET,
    )  # fmt: skip
    assert result.options["map_start"]["last_loss"] == point.losses[-1]
    torch.testing.assert_close(torch.tensor(result.losses), torch.tensor(by_hand.losses))


def test_the_model_is_left_as_it_was_and_a_second_fit_is_the_same():
    net = model()
    before = {k: v.clone() for k, v in net.net.state_dict().items() if "weight" in k}
    first = fit(net=net)
    assert net.init == "fresh" and net.inferred_init is None
    for name, value in before.items():
        assert torch.equal(net.net.state_dict()[name], value)  # the network's own weights back
    second = fit(net=net)
    assert first.losses == second.losses


def test_map_start_false_is_the_model_elbo_from_the_family_start():
    off = fit(loss={"map_start": False})
    assert off.options["map_start"].startswith("off")
    assert "lr_test" in off.options and off.steps + off.options["lr_test"]["steps"] == 120


@pytest.mark.parametrize(
    "options, why",
    [
        ({"num_steps": 60}, "could not measure its rate"),  # a MAP phase of 48 steps
        ({"lr": 0.01}, "a rate, schedule"),
        ({"optim": {"lr_schedule": "cosine"}}, "a rate, schedule"),
        # a rule of a few windows: num_steps="auto" is the same branch (the rule is not None)
        ({"num_steps": zoo.Convergence(window=10, cap=40)}, "convergence rule"),
        ({"guide": "whvi"}, "does not start at given weights"),
        ({"guide": "map"}, "does not start at given weights"),
        ({"guide": "mc_dropout"}, "its own start"),
    ],
)
def test_where_auto_does_not_run_it_says_why(options, why):
    result = fit(**options)
    assert result.options["map_start"].startswith("not run") and why in result.options["map_start"]


def test_a_checkpointed_fit_is_the_same_fit_and_writes_each_phase(tmp_path):
    path = tmp_path / "fit.ckpt"
    plain = fit()
    kept = fit(run=zoo.Run(progress=False, checkpoint=path, checkpoint_every=10))
    assert kept.losses == plain.losses and isinstance(kept.options["map_start"], dict)
    assert path.exists() and phase_path(path) == tmp_path / "fit.map-phase.ckpt"
    assert phase_path(path).exists() and phase_path(tmp_path / "f").name == "f.map-phase"


def _interrupt(phase: str, at: int):
    def callback(view):
        if type(view.result.guide).__name__ == phase and view.step == at:
            raise KeyboardInterrupt

    return callback


@pytest.mark.parametrize("phase,at", [("AutoMAP", 30), ("AutoDiagonal", 7)])
def test_a_fit_stopped_in_either_phase_resumes_exactly(tmp_path, phase, at):
    """Ctrl-C (a kill's checkpoint) in the MAP phase or in the family's, then ``resume=``: the
    losses, the MAP record and the posterior are the uninterrupted fit's."""
    path = tmp_path / "fit.ckpt"
    plain = fit()
    stopped = fit(run=zoo.Run(progress=False, checkpoint=path, callbacks=[_interrupt(phase, at)]))
    assert stopped.interrupted
    resumed = fit(run=zoo.Run(progress=False, checkpoint=path, resume=path))
    assert resumed.losses == plain.losses and not resumed.interrupted
    assert _timeless(resumed.options["map_start"]) == _timeless(plain.options["map_start"])
    assert (
        resumed.options["num_steps"] == 120
        and resumed.options["recipe"] == (plain.options["recipe"])
    )
    x = data()[0][:16]
    torch.testing.assert_close(
        resumed.predict(x, num_samples=4, seed=0, progress=False).probs,
        plain.predict(x, num_samples=4, seed=0, progress=False).probs,
    )


def test_a_fit_killed_between_the_phases_resumes_exactly(tmp_path):
    """Killed after the MAP phase ended and before the family's first checkpoint: only the
    phase file is there; the resume takes no further MAP step and fits the family as the fit
    never stopped would."""
    path = tmp_path / "fit.ckpt"
    plain = fit()
    fit(run=zoo.Run(progress=False, checkpoint=path))
    path.unlink()  # the family's phase had written nothing yet
    resumed = fit(run=zoo.Run(progress=False, checkpoint=path, resume=path))
    assert resumed.losses == plain.losses
    assert _timeless(resumed.options["map_start"]) == _timeless(plain.options["map_start"])


def _timeless(record: dict) -> dict:
    """A MAP phase's record without its seconds (its rate test's too)."""
    test = {k: v for k, v in record["lr_test"].items() if k != "seconds"}
    return {**{k: v for k, v in record.items() if k != "seconds"}, "lr_test": test}


def test_a_checkpoint_without_a_map_phase_resumes_as_its_fit(tmp_path):
    path = tmp_path / "own.ckpt"
    off = {"map_start": False}
    plain = fit(loss=off)
    stopped = fit(loss=off, run=zoo.Run(progress=False, checkpoint=path,
                                        callbacks=[_interrupt("AutoDiagonal", 40)]))  # fmt: skip
    assert stopped.interrupted
    resumed = fit(run=zoo.Run(progress=False, resume=path))  # map_start left at "auto"
    assert "without a MAP phase" in resumed.options["map_start"]
    assert resumed.losses == plain.losses
    with pytest.raises(ValueError, match="map_start=True.*without a MAP phase"):
        fit(loss={"map_start": True}, run=zoo.Run(progress=False, resume=path))


def test_a_phase_file_that_is_not_a_map_phase_is_refused(tmp_path):
    path = tmp_path / "fit.ckpt"
    fit(run=zoo.Run(progress=False, checkpoint=path))
    phase_path(path).write_bytes(path.read_bytes())  # the family's checkpoint in its place
    with pytest.raises(ValueError, match="not such a pair"):
        fit(run=zoo.Run(progress=False, resume=path))


def test_a_trained_network_is_fine_tuned_without_a_map_phase():
    net, train, _ = trained_cnn()
    model = zoo.models.from_module(net, init="module")
    result = zoo.fit(model, "diagonal", train, num_steps=120, batch_size=32, run=QUIET)
    assert "trained network" in result.options["map_start"]


def test_map_start_true_runs_a_short_fit_and_refuses_what_it_cannot_run(tmp_path):
    short = fit(num_steps=20, loss={"map_start": True})
    assert short.options["map_start"]["steps"] == 16 and short.steps == 4
    refused = [
        {"lr": 0.01, "run": zoo.Run(progress=False, checkpoint=tmp_path / "c.ckpt")},
        {"guide": "whvi"},
    ]
    for options in refused:
        with pytest.raises(ValueError, match="map_start=True.*cannot run here"):
            fit(loss={"map_start": True}, **options)
    assert not list(tmp_path.iterdir())  # refused before any step


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_a_bad_map_start_is_refused_naming_the_choices(value):
    with pytest.raises(ValueError, match="map_start must be 'auto', True or False"):
        zoo.Loss(map_start=value)


def test_a_callback_sees_both_phases_and_ctrl_c_in_the_map_phase_returns_it():
    seen = []

    def watch(view):
        seen.append(type(view.result.guide).__name__)

    result = fit(run=zoo.Run(progress=False, callbacks=[watch]))
    assert seen.count("AutoMAP") + seen.count("AutoDiagonal") == len(seen)
    assert seen.count("AutoDiagonal") == result.steps and "AutoMAP" in seen

    def interrupt(view):
        if view.step == 5:
            raise KeyboardInterrupt

    stopped = fit(run=zoo.Run(progress=False, callbacks=[interrupt]))
    assert stopped.interrupted and stopped.options["guide"] == "map"


def test_a_batch_norm_cnn_from_scratch_beats_its_start_and_keeps_its_statistics():
    x, y = blobs(600, 0)
    net = zoo.models.from_module(trained_cnn()[0].apply(_reset), init="fresh")
    result = zoo.fit(net, "diagonal", (x, y), num_steps=100, batch_size=32, run=QUIET)
    assert isinstance(result.options["map_start"], dict)
    assert result.evaluate(blobs(400, 1), num_samples=8, progress=False)["accuracy"] > 0.9


def _reset(module):
    if hasattr(module, "reset_parameters"):
        module.reset_parameters()


def test_a_family_named_without_options_takes_its_recipes_options_after_the_map_phase(tmp_path):
    """``"tridiagonal"`` from scratch fits ``parameterization="free"`` from the MAP weights (its
    recipe's ``map_start_options``), says so, and resumes as that; options the caller gives
    are the family's, untouched."""
    import guides
    from guides.registry import recipe

    assert recipe("tridiagonal").map_start_options == {"parameterization": "free"}
    assert recipe("diagonal").map_start_options == {}
    path = tmp_path / "fit.ckpt"
    named = fit("tridiagonal", run=zoo.Run(progress=False, checkpoint=path))
    assert named.guide.parameterization == "free"
    assert named.options["map_start"]["family_options"] == {"parameterization": "free"}
    resumed = fit("tridiagonal", run=zoo.Run(progress=False, checkpoint=path, resume=path))
    assert resumed.losses == named.losses and resumed.guide.parameterization == "free"
    given = fit(guides.family("tridiagonal", parameterization="posch"))
    assert given.guide.parameterization == "posch"
    assert given.options["map_start"]["family_options"] == {}
    plain = fit("diagonal")
    assert plain.options["map_start"]["family_options"] == {}
