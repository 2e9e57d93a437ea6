import dataclasses
import subprocess
import sys

import pytest

from tests.conftest import HANG_AFTER
from zoo.cli import build_parser

pytestmark = pytest.mark.slow  # starts the command line in child processes


def test_demo_writes_its_plot(tmp_path):
    out = tmp_path / "band.png"
    proc = subprocess.run(
        [sys.executable, "-m", "zoo", "demo", "--steps", "60", "--quiet", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=HANG_AFTER,
    )
    assert proc.returncode == 0, proc.stderr
    assert "test rmse" in proc.stdout and "coverage_95" in proc.stdout
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size > 10_000


def test_demo_help_names_every_option():
    text = build_parser()._subparsers._group_actions[0].choices["demo"].format_help()
    for option in (
        "--guide",
        "--steps",
        "--lr",
        "--points",
        "--noise",
        "--prior",
        "--seed",
        "--out",
        "--quiet",
    ):
        assert option in text


def test_fit_and_compare_commands(tmp_path, mnist_root):
    base = [sys.executable, "-m", "zoo"]
    common = [
        "--limit",
        "600",
        "--test-limit",
        "100",
        "--samples",
        "5",
        "--quiet",
        "--root",
        str(mnist_root),
        "--out-dir",
        str(tmp_path),
    ]
    proc = subprocess.run(
        base
        + [
            "fit",
            "--model",
            "lenet5",
            "--guide",
            "tridiagonal",
            "--guide-option",
            "parameterization=free",
            "--arviz-samples",
            "10",
            "--arviz-points",
            "50",
        ]
        + common,
        capture_output=True,
        text=True,
        timeout=HANG_AFTER,
    )
    assert proc.returncode == 0, proc.stderr
    assert "| accuracy |" in proc.stdout
    import zoo

    fit = zoo.load(tmp_path / "lenet5-tridiagonal-mnist.pt")
    assert fit.guide.parameterization == "free"
    assert (tmp_path / "lenet5-tridiagonal-mnist.nc").stat().st_size > 1000
    proc = subprocess.run(
        base
        + ["compare", "--model", "mlp", "--hidden", "32", "--guides", "lowrank", "mc_dropout"]
        + ["--guide-option", "mc_dropout.p=0.2"]
        + common,
        capture_output=True,
        text=True,
        timeout=HANG_AFTER,
    )
    assert proc.returncode == 0, proc.stderr
    assert "lowrank" in proc.stdout and "mc_dropout" in proc.stdout
    assert (tmp_path / "compare-mlp-mnist.csv").exists()


def test_every_command_explains_its_options():
    parser = build_parser()
    for name in ("demo", "fit", "compare"):
        text = parser._subparsers._group_actions[0].choices[name].format_help()
        for action in parser._subparsers._group_actions[0].choices[name]._actions:
            if action.option_strings and action.dest != "help":
                assert action.help, f"{name} {action.option_strings} has no help"
        assert "usage" in text


@pytest.mark.parametrize("text", ["abc", "-1", "0", "inf", "nan"])
def test_demo_refuses_a_bad_noise_before_fitting(text, capsys):
    with pytest.raises(SystemExit) as err:
        build_parser().parse_args(["demo", "--noise", text])
    assert err.value.code == 2
    message = capsys.readouterr().err
    assert "--noise" in message and "positive number" in message and repr(text) in message


@pytest.mark.parametrize(
    "text, value", [("0.25", 0.25), ("learned", "learned"), ("heteroscedastic", "heteroscedastic")]
)
def test_demo_noise_values(text, value):
    assert build_parser().parse_args(["demo", "--noise", text]).noise == value


def test_demo_prior_values(capsys):
    from zoo.priors import LayerwiseNormalPrior, NormalPrior

    def parse(text):
        return build_parser().parse_args(["demo", "--prior", text]).prior

    assert parse("default") is None and parse("learned") == "learned"
    assert isinstance(parse("normal:1"), NormalPrior) and float(parse("normal:2").scale) == 2.0
    assert isinstance(parse("layerwise:3"), LayerwiseNormalPrior)
    assert float(parse("layerwise:3").gain) == 3.0
    for bad in ("normal", "layerwise:-1", "wide:1", "normal:x"):
        with pytest.raises(SystemExit):
            parse(bad)
        assert "layerwise:G" in capsys.readouterr().err


def usage_error(argv, capsys) -> str:
    from zoo.cli import main

    with pytest.raises(SystemExit) as err:
        main(argv)
    assert err.value.code == 2
    return capsys.readouterr().err


def test_mistakes_are_usage_errors_before_any_work(capsys, monkeypatch):
    import torch

    message = usage_error(
        ["fit", "--data", "toy", "--guide", "lowrank", "--guide-option", "rnak=3"], capsys
    )
    assert "unknown option(s) ['rnak']" in message and "rank" in message
    message = usage_error(
        ["fit", "--data", "toy", "--guide", "whvi", "--guide-option", "block_size=3"], capsys
    )
    assert "block_size must be None" in message  # none parses to None (the paper's blocks)
    from zoo.cli.values import guide_options

    assert guide_options(["block_size=none", "rank=5", "learn_scales=false"]) == {
        "block_size": None, "rank": 5, "learn_scales": False}  # fmt: skip
    message = usage_error(["compare", "--data", "toy", "--guide-option", "rank=3"], capsys)
    assert "FAMILY.KEY=VALUE" in message
    message = usage_error(
        ["fit", "--data", "toy", "--guide", "mc_dropout", "--guide-option", "p=1.5"], capsys
    )
    assert "p must lie in [0, 1), got 1.5" in message
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    message = usage_error(["fit", "--data", "toy", "--device", "cuda"], capsys)
    assert "no CUDA device" in message
    message = usage_error(["fit", "--data", "toy", "--model", "lenet5"], capsys)
    assert "--data toy" in message and "--model mlp" in message


def test_help_shows_the_defaults():
    parser = build_parser()
    for command in ("fit", "compare", "demo"):
        text = parser._subparsers._group_actions[0].choices[command].format_help()
        assert "(default: None)" not in text, command
    text = parser._subparsers._group_actions[0].choices["fit"].format_help()
    assert "(default: diagonal)" in text and "default: 128" in " ".join(text.split())
    demo = parser._subparsers._group_actions[0].choices["demo"].format_help()
    assert "N(0, 2 / fan_in)" in " ".join(demo.split())  # the regression MLP's real prior


@pytest.mark.parametrize(
    "argv,expected",
    [
        (["fit", "--data", "toy", "--guide", "lowrank", "--guide-option", "rank=five"], "five"),
        (["fit", "--data", "toy", "--epochs", "0"], "--epochs"),
        (["fit", "--data", "toy", "--num-steps", "forever"], "--num-steps"),
        (["fit", "--data", "toy", "--batch-size", "0"], "--batch-size"),
        (["fit", "--data", "toy", "--lr", "-1"], "--lr"),
        (["fit", "--data", "toy", "--lr", "fast"], "--lr"),
        (["fit", "--data", "toy", "--num-steps", "10", "--lr", "auto"], 'lr="auto"'),
        (["fit", "--data", "toy", "--limit", "-5"], "--limit"),
        (["fit", "--data", "toy", "--strategy", "dpp"], "dpp"),
        (["demo", "--steps", "0"], "--steps"),
        (["compare", "--data", "cifar10", "--root", "{tmp}", "--guides", "diagonal"], "CIFAR10"),
    ],
)
def test_usage_mistakes_are_one_error_line_of_that_command(argv, expected, capsys, tmp_path):
    from zoo.cli import main

    argv = [a.format(tmp=tmp_path) for a in argv]
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"zoo {argv[0]}: error:" in err and expected in err
    assert "Traceback" not in err and f"usage: zoo {argv[0]}" in err


def test_toy_fit_needs_no_model_and_takes_the_noise(tmp_path):
    from zoo.cli import main

    argv = [
        "fit",
        "--data",
        "toy",
        "--hidden",
        "8",
        "--epochs",
        "2",
        "--samples",
        "5",
        "--arviz-samples",
        "5",
        "--arviz-points",
        "20",
        "--noise",
        "0.2",
        "--quiet",
        "--out-dir",
        str(tmp_path),
    ]
    assert main(argv) == 0
    import zoo

    fit = zoo.load(tmp_path / "mlp-diagonal-toy.pt")
    assert float(fit.model.likelihood.noise) == pytest.approx(0.2)
    argv = [
        "compare",
        "--data",
        "toy",
        "--hidden",
        "8",
        "--epochs",
        "1",
        "--samples",
        "5",
        "--guides",
        "diagonal",
        "lowrank",
        "--guide-option",
        "lowrank.rank=2",
        "--quiet",
        "--out-dir",
        str(tmp_path),
    ]
    assert main(argv) == 0


def test_the_demo_follows_the_data_and_widens_its_band_away_from_it(tmp_path):
    """``python -m zoo demo``: the fit's test RMSE near the toy's noise and its epistemic band
    wider between the two observed intervals and beyond them than on them."""
    import re

    out = tmp_path / "band.png"
    proc = subprocess.run(
        [sys.executable, "-m", "zoo", "demo", "--quiet", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=HANG_AFTER,
    )
    assert proc.returncode == 0, proc.stderr
    printed = (
        re.search(r"test rmse: ([\d.]+)", proc.stdout)[1],
        re.search(r"test coverage_95: ([\d.]+)", proc.stdout)[1],
    )
    sds = re.search(
        r"on the data: ([\d.]+) +in the gap \|x\| < 0.5: ([\d.]+) +beyond \|x\| > 4: "
        r"([\d.]+)",
        proc.stdout,
    ).groups()
    # the demo follows the data (RMSE within 20% of the toy's noise, 0.1, under the regression
    # default prior N(0, 2 / fan_in)) and widens the band between the intervals and beyond them
    assert 0 < float(printed[1]) <= 1
    on_data, gap, beyond = (float(v) for v in sds)
    assert float(printed[0]) <= 0.12
    assert gap > 1.2 * on_data and beyond > 2 * on_data


def test_fit_passes_the_process_options_to_zoo_fit(tmp_path, monkeypatch, capsys):
    """--devices/--num-nodes/--strategy/--accelerator reach zoo.fit as Lightning's names (a
    real two-process run of the command is in the issue notes; tests/zoo/runtime/test_distributed.py
    runs zoo.fit itself on two ranks)."""
    import zoo
    from zoo.cli import main

    seen = {}
    real_fit = zoo.fit

    def recording_fit(*args, **kwargs):
        engine = kwargs["engine"]  # zoo.Engine, built from the flags
        seen.update(
            {k: getattr(engine, k) for k in ("devices", "num_nodes", "strategy", "accelerator")}
        )
        one = dataclasses.replace(engine, devices=1, num_nodes=1, strategy="auto")
        return real_fit(*args, **{**kwargs, "engine": one})

    monkeypatch.setattr(zoo, "fit", recording_fit)
    argv = ["fit", "--data", "toy", "--epochs", "1", "--samples", "4", "--arviz-samples", "4"]
    argv += ["--quiet", "--out-dir", str(tmp_path), "--devices", "2", "--num-nodes", "3"]
    assert main(argv + ["--strategy", "ddp", "--accelerator", "cpu"]) == 0
    assert seen == {"devices": 2, "num_nodes": 3, "strategy": "ddp", "accelerator": "cpu"}
    assert "| steps |" in capsys.readouterr().out


def test_fit_takes_num_steps_auto(monkeypatch, tmp_path, capsys):
    """``--num-steps auto`` reaches zoo.fit as the convergence rule (here a small one)."""
    import zoo
    from zoo.cli import main

    seen = {}
    real_fit = zoo.fit

    def recording_fit(*args, **kwargs):
        seen["num_steps"] = kwargs["num_steps"]
        rule = zoo.Convergence(window=20, patience=1, tolerance=10.0, cap=200)  # stops soon
        return real_fit(*args, **{**kwargs, "num_steps": rule})

    monkeypatch.setattr(zoo, "fit", recording_fit)
    argv = ["fit", "--data", "toy", "--num-steps", "auto", "--samples", "4", "--arviz-samples"]
    assert main(argv + ["4", "--quiet", "--out-dir", str(tmp_path)]) == 0
    assert seen == {"num_steps": "auto"}


def test_every_group_flag_reaches_zoo_fit_in_its_group(monkeypatch, tmp_path, capsys):
    """The flags the option groups declare (zoo.training.options) arrive as zoo.fit's groups."""
    import zoo
    from zoo.cli import main

    seen = {}
    real_fit = zoo.fit

    def recording_fit(*args, **kwargs):
        seen.update({k: kwargs[k] for k in ("optim", "loss", "engine", "run")})
        return real_fit(*args, **kwargs)

    monkeypatch.setattr(zoo, "fit", recording_fit)
    argv = ["fit", "--data", "toy", "--num-steps", "4", "--samples", "4", "--arviz-samples", "4"]
    argv += ["--quiet", "--out-dir", str(tmp_path), "--optimizer", "sgd", "--lr", "1e-4"]
    argv += ["--estimator", "local", "--jit", "false", "--accumulate", "2"]
    argv += ["--on-divergence", "skip", "--checkpoint", str(tmp_path / "fit.ckpt")]
    assert main(argv) == 0
    assert seen["optim"] == zoo.Optim(optimizer="sgd")
    assert seen["loss"] == zoo.Loss(estimator="local")
    engine, run = seen["engine"], seen["run"]
    assert (engine.jit, engine.accumulate, engine.check_every) == (False, 2, "auto")
    assert (run.progress, run.on_divergence) == (False, "skip")
    assert (tmp_path / "fit.ckpt").exists()


@pytest.mark.parametrize(
    "flags, expected",
    [([], "auto"), (["--cuda-graph"], True), (["--cuda-graph", "false"], False)],
)
def test_the_cuda_graph_flag_defaults_to_auto_and_alone_means_true(flags, expected):
    args = build_parser().parse_args(["fit", "--data", "toy", *flags])
    assert args.cuda_graph == expected


@pytest.mark.parametrize(
    "flags, phrase",
    [
        (["--hidden", "-5"], "expected a whole number of at least 1, got '-5'"),
        (["--hidden", "0"], "expected a whole number of at least 1, got '0'"),
        (["--devices", "0"], "expected a whole number of at least 1, got '0'"),
    ],
)
def test_sizes_and_device_counts_are_refused_by_the_parser(flags, phrase, capsys):
    """An argparse message and exit code 2, not a traceback from deep inside the fit."""
    with pytest.raises(SystemExit) as err:
        build_parser().parse_args(["fit", "--data", "toy", *flags])
    assert err.value.code == 2
    assert phrase in capsys.readouterr().err


def test_devices_takes_all_and_auto():
    assert build_parser().parse_args(["fit", "--devices", "-1"]).devices == -1
    assert build_parser().parse_args(["fit", "--devices", "auto"]).devices == "auto"


def test_resuming_another_familys_checkpoint_is_refused(tmp_path, capsys):
    """--guide tridiagonal --resume of a low-rank checkpoint ran to the end and saved the
    low-rank fit under the tridiagonal's name; now a usage error before any step."""
    from zoo.cli import main

    ckpt = tmp_path / "fit.ckpt"
    common = ["fit", "--data", "toy", "--num-steps", "3", "--quiet", "--out-dir", str(tmp_path)]
    assert main([*common, "--guide", "lowrank", "--checkpoint", str(ckpt)]) == 0
    capsys.readouterr()
    message = usage_error([*common, "--guide", "tridiagonal", "--resume", str(ckpt)], capsys)
    assert "checkpoint of the 'lowrank' family" in message
    assert not (tmp_path / "mlp-tridiagonal-toy.pt").exists()


def test_compare_takes_the_baselines(tmp_path, capsys):
    """``--guides ... laplace ensemble`` with their options: one row each (laplace-torch
    installed for the Laplace row); a baseline's unknown option is a usage error."""
    from zoo.cli import main

    pytest.importorskip("laplace", exc_type=ImportError)
    args = ["compare", "--data", "toy", "--num-steps", "60", "--samples", "5", "--quiet"]
    args += ["--guides", "map", "laplace", "ensemble", "--guide-option", "ensemble.members=2"]
    args += ["--guide-option", "laplace.hessian=diag", "--out-dir", str(tmp_path)]
    assert main(args) == 0
    table = (tmp_path / "compare-mlp-toy.csv").read_text()
    assert {line.split(",")[0] for line in table.splitlines()[1:]} == {"map", "laplace", "ensemble"}
    for bad, message in (
        ("laplace.hesian=diag", "takes the options"),
        ("ensemble.members=0", "members must be an int"),
    ):
        with pytest.raises(SystemExit):
            main(["compare", "--data", "toy", "--guides", "laplace", "ensemble",
                  "--guide-option", bad])  # fmt: skip
        assert message in capsys.readouterr().err


@pytest.mark.parametrize("model, cls", [("resnet20", "ResNet"), ("lstm", "RecurrentClassifier")])
def test_fit_takes_the_new_networks(model, cls, tmp_path, mnist_root):
    """ResNet-20 on MNIST's images, the LSTM on MNIST read as 28 rows of 28 pixels; the saved
    fit rebuilds its model from its spec, batch norm's statistics included."""
    argv = [sys.executable, "-m", "zoo", "fit", "--model", model, "--limit", "64"]
    argv += ["--test-limit", "32", "--samples", "2", "--quiet", "--root", str(mnist_root)]
    argv += ["--out-dir", str(tmp_path), "--arviz-samples", "2", "--arviz-points", "8"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=HANG_AFTER)
    assert proc.returncode == 0, proc.stderr
    assert "| accuracy |" in proc.stdout
    import zoo

    fit = zoo.load(tmp_path / f"{model}-diagonal-mnist.pt")
    assert type(fit.model).__name__ == cls
    if model == "resnet20":
        assert int(fit.model.net.bn1.num_batches_tracked) == 1  # one step of 64 images


def test_sequence_models_refuse_colour_images(capsys):
    from zoo.cli import main

    with pytest.raises(SystemExit):
        main(["fit", "--model", "transformer", "--data", "cifar10"])
    assert "as sequences of rows" in capsys.readouterr().err


def test_subnetwork_options_and_a_missing_laplace_torch_on_the_command_line(
    tmp_path, capsys, monkeypatch
):
    """``--guide-option size=32`` is the subnetwork family's own argument (it was refused as
    "no options of its own"); without laplace-torch, a laplace row is a one-line usage error."""
    from zoo.cli import main
    from zoo.results import laplace_torch

    args = ["fit", "--data", "toy", "--guide", "subnetwork", "--guide-option", "size=32"]
    assert main(args + ["--num-steps", "3", "--quiet", "--out-dir", str(tmp_path)]) == 0

    def missing():
        raise ImportError('the Laplace baseline needs laplace-torch (No module named '
                          '\'laplace\'): pip install "bnn-zoo[laplace]"')  # fmt: skip

    monkeypatch.setattr(laplace_torch, "import_laplace", missing)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(["compare", "--data", "toy", "--guides", "map", "laplace", "--quiet"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()  # argparse's usage, then one line
    assert err[-1].startswith("zoo compare: error: ") and "laplace-torch" in err[-1]
    assert "Traceback" not in "\n".join(err)


def test_a_bad_guide_option_names_no_site_of_the_probe(capsys):
    message = usage_error(
        ["fit", "--model", "lstm", "--guide", "lowrank", "--guide-option", "rank=0"], capsys
    )
    assert "rank must be a positive integer, got 0" in message
    assert "fc1" not in message and "site" not in message  # the probe's, not the LSTM's


@pytest.mark.parametrize(
    "argv, phrase",
    [
        (["--model", "resnet20", "--hidden", "30"], "--model resnet20 has its own architecture"),
        (["--model", "alexnet", "--hidden", "30"], "--model alexnet has its own architecture"),
        (["--model", "transformer", "--hidden", "8"], "--model transformer has its own"),
        (["--model", "lenet5", "--hidden", "30", "40"], "takes one --hidden width, got [30, 40]"),
        (["--model", "lstm", "--hidden", "30", "40"], "takes one --hidden width"),
    ],
)
def test_hidden_widths_a_model_does_not_take_are_refused(argv, phrase, capsys):
    assert phrase in usage_error(["fit", "--data", "mnist", *argv], capsys)
