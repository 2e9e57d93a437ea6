"""The tables and figures that the documentation and benchmarks/README.md quote from issue 35's
saved runs are those runs' (``benchmarks/results/*.json``), as the scripts print them."""

import contextlib
import io
import json
import re
import sys

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import depth  # noqa: E402
import mnist_accuracy  # noqa: E402
import reference  # noqa: E402
import regression  # noqa: E402

pytestmark = pytest.mark.slow  # loads and re-runs saved runs

RESULTS = REPO / "benchmarks" / "results"
BENCH_README = (REPO / "benchmarks" / "README.md").read_text()


def _rows(path: str) -> list[dict]:
    return json.loads((RESULTS / path).read_text())["rows"]


def _numbers(line: str) -> list[float]:
    return [float(v) for v in re.findall(r"(?<![\w.])-?\d+\.\d+", line)]


def test_the_length_table_is_the_two_saved_regression_runs():
    fixed, auto = (
        json.loads((RESULTS / f"regression_{name}_length.json").read_text())["fits"]
        for name in ("fixed", "auto")
    )
    lines = regression.length_table(fixed, auto)
    assert len(lines) == 2 + 3 * 7  # three data sets, seven rows each
    for line in lines:
        assert line in BENCH_README, line


def test_the_baselines_tables_are_their_saved_runs():
    """The regression table of the baselines is ``regression.py``'s print of its saved run,
    and the digits table against HMC holds the saved run's numbers."""
    saved = json.loads((RESULTS / "regression_baselines.json").read_text())["table"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        regression.print_table(saved)
    for line in out.getvalue().splitlines():
        assert line in BENCH_README, line
    digits = json.loads((RESULTS / "reference_baselines.json").read_text())["digits"]["table"]
    table = BENCH_README.split("| row (digits) |")[1].split("\n\n")[0].splitlines()
    for label, row in digits.items():
        line = next(x for x in table if x.startswith(f"| {label} | "))
        want = [row[k] for k in ("accuracy", "nll", "ece", "agreement", "total_variation")]
        got = [float(v) for v in line.split("|")[3:8]]
        assert got == [round(v, 3) for v in want], (label, got, want)
        if row["parameters"] is not None:
            assert int(line.split("|")[2].replace(",", "")) == row["parameters"]


def test_the_baselines_mnist_cpu_table_is_its_saved_run():
    saved = json.loads((RESULTS / "baselines_mnist_cpu.json").read_text())["rows"]
    for r in saved:
        line = (
            f"| {r['row']} | {r['fit_seconds']:.1f} | {r['fit_peak_mib']:.0f} | "
            f"{r['accuracy']:.4f} | {r['nll']:.4f} | {r['ece']:.4f} | {r['auroc_noise']:.3f} "
            f"| {r['auroc_permuted']:.3f} |"
        )
        assert line in BENCH_README, line


def test_the_new_families_regression_table_is_its_saved_run():
    saved = json.loads((RESULTS / "regression_new_families.json").read_text())["table"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        regression.print_table(saved)
    for line in out.getvalue().splitlines():
        assert line in BENCH_README, line


@pytest.mark.parametrize(
    "name, rows",
    [
        ("reference_subnetwork", ("subnetwork", "diagonal")),
        ("reference_whvi", ("whvi", "whvi diagonal q(g)", "diagonal")),
    ],
)
def test_a_family_against_hmc_table_is_its_saved_run(name, rows):
    saved = json.loads((RESULTS / f"{name}.json").read_text())
    for data, result in saved.items():
        for row in rows:
            r = result["table"][row]
            if data == "diabetes":
                cells = f"RMSE {r['rmse']:.3f} | {r['nll']:.3f} | W2 {r['w2']:.3f} |"
            else:
                tv = r["total_variation"]
                cells = f"accuracy {r['accuracy']:.3f} | {r['nll']:.3f} | TV {tv:.3f} |"
            line = f"| {data} | {row} | {int(r['parameters']):,} | {cells}"
            assert line in BENCH_README, line


def test_the_subnetwork_selection_table_is_its_saved_run():
    saved = json.loads((RESULTS / "subnetwork_selection.json").read_text())
    for data, table in saved.items():
        for row, r in table.items():
            metric = f"RMSE {r['rmse']:.3f}" if "rmse" in r else f"accuracy {r['accuracy']:.3f}"
            far = f"W2 {r['w2']:.3f}" if "w2" in r else f"TV {r['total_variation']:.3f}"
            per = ", ".join(f"{k} {v}" for k, v in r["chosen_per_site"].items()) or "-"
            line = f"| {data} | {row} | {per} | {metric} | {r['nll']:.3f} | {far} |"
            assert line in BENCH_README, line


def test_the_dropout_tables_are_the_saved_mnist_runs():
    section = BENCH_README.split("### MC dropout on MNIST")[1].split("### Fits that run")[0]
    tables = [
        [line for line in block.splitlines() if line.startswith("| ") and "---" not in line][1:]
        for block in section.split("\n\n")
        if block.lstrip().startswith("| ")
    ]
    study, factors, seeds = tables
    for line, row in zip(study, _rows("mnist_dropout.json"), strict=True):
        assert _numbers(line)[-4:] == [
            round(row[k], 4) for k in ("accuracy", "nll", "ece", "brier")
        ]
    for line, row in zip(
        factors,
        _rows("mnist_dropout_factors.json")[:6] + _rows("mnist_dropout_factors.json")[6::2],
        strict=True,
    ):
        assert _numbers(line)[-4:] == [
            round(row[k], 4) for k in ("accuracy", "nll", "ece", "brier")
        ]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        mnist_accuracy.print_seed_summary(_rows("mnist_dropout_seeds.json"))
    assert [line for line in out.getvalue().splitlines()[2:]] == seeds


def test_the_stated_priors_are_those_of_the_models_that_ran():
    """The depth study and the diabetes references state the prior ``N(0, 2 / fan_in)``: the
    models their scripts build carry it (He's gain, sqrt(2), per layer), not ``N(0, 1)``."""
    import torch
    from pyro import poutine

    models = [depth.network(d) for d in depth.DEPTHS] + [reference.load("diabetes")[2]()]
    for model in models:
        trace = poutine.trace(model).get_trace(torch.zeros(3, 10))
        for name, site in trace.nodes.items():
            if name not in model.site_shapes or name == "noise":
                continue
            fan_in = site["value"].shape[-1] if name.endswith("weight") else None
            if fan_in is not None:  # a bias takes its layer's fan-in
                want = (2.0 / fan_in) ** 0.5
            sd = site["fn"].stddev  # the prior's standard deviation of every weight
            assert torch.allclose(sd, torch.full_like(sd, want)), name
    stated = "N(0, 2 / fan_in)"
    notebook = (REPO / "notebooks" / "09_structure_and_depth.ipynb").read_text()
    for text in (depth.__doc__, reference.__doc__, notebook):
        assert stated in text
    assert "default `N(0, 1)`" not in notebook and "default ``N(0, 1)``" not in depth.__doc__


def test_the_task_rate_table_is_its_saved_run_and_the_default_is_what_it_claims():
    """benchmarks/README.md's table of the minibatch rates is ``task_rate.py``'s print of its
    saved fits; ``zoo.fit``'s default rate and schedule are the run's "3e-3 decaying tenfold";
    it is better than the constant 1e-3 of earlier releases on every budget of the digits and
    MNIST for every family but WHVI, and never at chance on the template images, where 1e-2 is
    for some; WHVI's ``lr_scale`` 3 runs near 1e-2, its best rate on every budget."""
    import task_rate

    import guides
    from zoo.training.recipes import DEFAULT_LR, DEFAULT_SCHEDULE

    results = json.loads((RESULTS / "task_rate.json").read_text())["results"]
    for line in task_rate.table_lines(results):
        assert line in BENCH_README, line
    default = {"lr": DEFAULT_LR, "lr_schedule": DEFAULT_SCHEDULE}
    assert task_rate.RATES["3e-3 decaying tenfold"] == default
    nll = {(r["budget"], r["family"], r["rate"]): r["nll"] for r in results}
    accuracy = {(r["budget"], r["family"], r["rate"]): r["accuracy"] for r in results}
    families = {r["family"] for r in results}
    for budget in ("digits-10", "digits-100", "mnist-5", "mnist-full"):
        for family in families - {"whvi"}:
            mine, old = (
                nll[budget, family, "3e-3 decaying tenfold"],
                nll[budget, family, "1e-3 constant"],
            )
            assert mine <= old + 0.005, (budget, family, mine, old)
    for family in families:
        assert accuracy["templates-60", family, "default"] > 0.5, family
    assert min(accuracy["templates-60", f, "1e-2 decaying tenfold"] for f in families) < 0.2
    assert guides.recipe("whvi").lr_scale == 3.0
    for budget in task_rate.BUDGETS:
        whvi = {rate: nll[budget, "whvi", rate] for rate in task_rate.RATES if rate != "default"}
        assert min(whvi, key=whvi.get) == "1e-2 decaying tenfold", budget


def test_the_whvi_block_tables_are_their_saved_runs():
    """benchmarks/README.md's "WHVI's blocks" rows are whvi_blocks.py's print of its runs."""
    import whvi_blocks

    for name in ("whvi_blocks_digits", "whvi_blocks_digits_x10", "whvi_blocks"):
        results = json.loads((RESULTS / f"{name}.json").read_text())["results"]
        for line in whvi_blocks.table_lines(results)[2:]:
            assert line in BENCH_README, (name, line)


@pytest.mark.parametrize(
    "sweeps_file, grids_file",
    [("rate_sweeps", "fairness"), ("rate_sweeps_held_out", "rate_held_out")],
)
def test_the_rate_rules_tables_are_their_saved_sweeps_scored(sweeps_file, grids_file):
    """benchmarks/README.md's "Which rule should read the sweep?" tables (the fairness
    problems', the held-out problems') are rate_rules.py's score of their saved sweeps on their
    saved grids, and the row of the library's rule is ``zoo.training.rate_rule.choose``'s."""
    import rate_rules

    sweeps = json.loads((RESULTS / f"{sweeps_file}.json").read_text())["sweeps"]
    results = json.loads((RESULTS / f"{grids_file}.json").read_text())["results"]
    lines = rate_rules.score(sweeps, results)
    assert any("(zoo's)" in line for line in lines)
    for line in lines:
        assert line in BENCH_README, line


def test_the_fairness_table_is_its_saved_fits():
    """benchmarks/README.md's table of every family's default call against its grid's best, at
    every problem and budget, is ``fairness.py``'s print of its saved fits, all 112 rows."""
    import fairness

    results = json.loads((RESULTS / "fairness.json").read_text())["results"]
    lines = fairness.table_lines(fairness.summarise(results))
    assert len(lines) == 2 + 112
    for line in lines:
        assert line in BENCH_README, line


def test_the_tempered_default_calls_are_their_saved_fits_against_the_grids():
    """The 30 rows whose default calls were fitted again at a KL weight of 0.1, against the
    table's grids: ``fairness.refitted_rows`` of the saved tempered fits and the table."""
    import fairness

    tempered = json.loads((RESULTS / "fairness_kl01.json").read_text())["results"]
    table = json.loads((RESULTS / "fairness.json").read_text())["results"]
    assert {r["kl_weight"] for r in tempered} == {0.1} and all(r["default"] for r in tempered)
    rows = fairness.refitted_rows(tempered, table)
    assert len(rows) == 30 and sum(not fairness.within(r) for r in rows) == 2
    for line in fairness.table_lines(rows):
        assert line in BENCH_README, line


def test_the_rates_of_another_machine_are_its_saved_sweeps_against_the_table():
    """The rates this machine's sweeps chose that differ from the table's saved default calls
    (benchmarks/README.md, "The table on another machine") are rate_rules.py's against."""
    import rate_rules

    sweeps = json.loads((RESULTS / "rate_sweeps_machine.json").read_text())["sweeps"]
    results = json.loads((RESULTS / "fairness.json").read_text())["results"]
    lines = rate_rules.against(sweeps, results)
    assert len(lines) > 3
    for line in lines:
        assert line.strip() in BENCH_README, line


def test_the_default_calls_of_another_machine_are_its_saved_fits_against_the_grids():
    """The ResNet-8 rows whose rate another machine chose differently, their default calls fitted
    there against the table's grids: ``fairness.py``'s print of the saved fits merged into the
    table's."""
    import fairness

    here = json.loads((RESULTS / "fairness_machine.json").read_text())["results"]
    table = json.loads((RESULTS / "fairness.json").read_text())["results"]
    lines = fairness.table_lines(fairness.refitted_rows(here, table))
    assert len(lines) == 2 + 4
    for line in lines[2:]:
        assert line in BENCH_README, line


@pytest.mark.parametrize("name", ["rate_held_out", "rate_held_out_min4", "rate_held_out_steps8"])
def test_the_held_out_default_calls_are_their_saved_runs(name):
    """The held-out problems' tables of default calls against their grids (the library's rule,
    the first rule, an 8-step sweep) are ``fairness.py``'s print of their saved fits."""
    import fairness

    saved = json.loads((RESULTS / f"{name}.json").read_text())
    lines = fairness.table_lines(fairness.summarise(saved["results"]))
    assert len(lines) > 2
    for line in lines:
        assert line in BENCH_README, (name, line)


@pytest.mark.parametrize("saved", ["rate_cost.json", "rate_cost_per_draw.json"])
def test_the_rate_cost_tables_are_their_saved_runs(saved):
    import rate_cost

    results = json.loads((RESULTS / saved).read_text())["results"]
    for line in rate_cost.table_lines(results):
        assert line in BENCH_README, line


@pytest.mark.parametrize("saved", ["laplace_prior.json", "laplace_prior_resnet.json"])
def test_the_laplace_prior_tables_are_their_saved_runs(saved):
    import laplace_prior

    for line in laplace_prior.table_lines(_rows(saved)):
        assert line in BENCH_README, line


@pytest.mark.parametrize(
    "saved, rates",
    [
        ("laplace_online.json", 2),
        ("laplace_online_seeds.json", 2),
        ("laplace_online_digits.json", 1),
        ("laplace_online_digits_x10.json", 1),
        ("laplace_online_mnist.json", 1),
    ],
)
def test_the_laplace_online_tables_are_their_saved_runs(saved, rates):
    import laplace_online

    rows = _rows(saved)
    assert [r["prior"] for r in rows] == ["online", "fixed 1"] * rates
    lines = laplace_online.table_lines(rows)
    assert BENCH_README.count("\n".join(lines[:2])) == 5  # every table headed
    for line in lines:
        assert line in BENCH_README, line


@pytest.mark.parametrize("name", ["held_out_curve", "held_out_curve_per_draw"])
def test_the_held_out_curve_tables_are_their_saved_runs(name):
    """The shared-statistics run and the per-draw one (each draw's own statistics mid-fit)."""
    import held_out_curve

    for line in held_out_curve.table_lines(_rows(f"{name}.json")):
        assert line in BENCH_README, line


def test_the_elbo_against_nll_table_is_its_saved_run():
    import elbo_against_nll

    for line in elbo_against_nll.table_lines(_rows("elbo_against_nll.json")):
        assert line in BENCH_README, line


def test_the_posch_objective_tables_are_their_saved_run():
    import posch_objective

    saved = json.loads((RESULTS / "posch_objective.json").read_text())
    assert [(r["rate"], r["kl_weight"]) for r in saved["fits"]] == [
        (rate, weight) for rate in ("default", "x 10") for weight in (1.0, 0.1, 0.01)
    ]
    lines = posch_objective.table_lines(
        saved["start"], saved["fits"], saved["initial_median_abs_mean"]
    )
    for line in lines:
        assert not line or line in BENCH_README, line


def test_the_per_draw_elbo_table_is_its_four_saved_runs():
    """One table stacked from the diagonal, matrix normal, tridiagonal and block diagonal runs,
    each row as ``elbo_against_nll.py`` prints it, the header once."""
    import elbo_against_nll

    for k, family in enumerate(("diagonal", "matrix_normal", "tridiagonal", "block_diagonal")):
        saved = json.loads((RESULTS / f"elbo_per_draw_{family}.json").read_text())
        assert saved["family"] == family and saved["problem"] == "resnet"
        lines = elbo_against_nll.table_lines(saved["rows"], family)
        for line in lines if k == 0 else lines[2:]:
            assert line in BENCH_README, line


def test_the_kept_inputs_table_is_its_saved_run():
    import kept_inputs

    saved = json.loads((RESULTS / "kept_inputs.json").read_text())
    assert [r["kept"] for r in saved["rows"]] == [None, 64, 128, 256, 512]
    for line in kept_inputs.table_lines(saved):
        assert line in BENCH_README, line


def test_the_draw_statistics_table_is_its_saved_run():
    """The per-draw table and its cost ratio, as ``draw_statistics.py`` prints its saved run."""
    import draw_statistics

    saved = json.loads((RESULTS / "draw_statistics.json").read_text())
    lines = draw_statistics.table_lines(saved)
    for line in lines[:-1]:
        assert line in BENCH_README, line
    ratio = _numbers(lines[-1])[0]
    assert f"1,000 test digits {ratio:.2f} times" in BENCH_README


def test_the_fairness_table_is_its_saved_run():
    """benchmarks/README.md's table of the default call against the grid is
    ``fairness.py``'s print of its saved fits, and each family's declared ``lr_scale`` is the
    one the saved default calls ran with."""
    import fairness

    import guides

    saved = json.loads((RESULTS / "fairness.json").read_text())
    for line in fairness.table_lines(fairness.summarise(saved["results"])):
        assert line in BENCH_README, line
    for line in fairness.accuracy_lines(saved["results"], "digits"):
        assert line in BENCH_README, line
    for family, scales in saved["lr_scales"].items():
        recipe = guides.recipe(family)
        assert [recipe.scale(False), recipe.scale(True)] == scales, family


def test_the_subnetwork_correlations_table_is_its_saved_run():
    import subnetwork_correlations

    saved = json.loads((RESULTS / "subnetwork_correlations.json").read_text())
    rows = saved["rows"]
    fits = [
        (rule, factor, row)
        for rule in ("variance", "magnitude")
        for factor in ("K N", "sqrt(K) N", "N")
        for row in ("default call", "lr 0.03", "lr 0.09", "default call, 16 draws a step")
    ]
    assert [(r["rule"], r["factor"], r["row"]) for r in rows if "factor" in r] == fits
    for line in subnetwork_correlations.table_lines(rows):
        assert line in BENCH_README, line
    # the README's reading: the default call learns at least 40 times less than the Laplace,
    # and no fit's correlations are the Laplace's
    default, laplace = rows[13]["blocks"], rows[25]["blocks"]
    assert rows[13]["factor"] == "K N" and rows[25]["row"].startswith("Laplace")
    assert all(laplace[k] > 40 * default[k] for k in default)
    assert all(abs(r["pattern"]) < 0.2 for r in rows if "pattern" in r)
