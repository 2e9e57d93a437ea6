"""Each benchmark script runs at tiny sizes and writes its result (no timing is checked: timings
are the scripts' job, read from one run on a quiet machine), and what a script builds over
several runs (a checkpoint, a merged result) comes back as it was."""

import json
import os
import sys
from pathlib import Path

import pytest

import zoo
from tests.conftest import HANG_AFTER, REPO
from tests.warm import WARM

sys.path.insert(0, str(REPO / "benchmarks"))
try:
    import posch_pilz
    import step_time
    import suite
finally:
    sys.path.remove(str(REPO / "benchmarks"))

pytestmark = pytest.mark.slow  # runs the benchmark scripts

#: Each script's tiny run: its arguments (``{tmp}``: a scratch folder, ``{data}``: the MNIST
#: root) and rows its tables must hold (a row's first cell).
TINY = {
    "step_time": (["--net", "tiny", "--rounds", "1", "--steps", "2"],
                  ["hand-written BBB", "pyro AutoNormal + SVI", "zoo diagonal",
                   "zoo map (point mass)"]),
    "step_memory": (["--width", "300", "--families", "diagonal", "map"], ["diagonal", "map"]),
    "startup": (["--net", "tiny", "--rounds", "1", "--long", "6"],
                ["tiny", "torch + pyro", "zoo", "python -m zoo --help"]),
    "any_network": (["--root", "{data}", "--nets", "lstm", "--families", "map", "diagonal",
                     "--batch", "8", "--short", "1", "--long", "3", "--repeat", "1"],
                    ["map", "diagonal"]),
    "width": (["--widths", "32", "64", "--rounds", "1", "--steps", "2", "--rows",
               "deterministic", "diagonal"], ["deterministic", "diagonal"]),
    "predict_time": (["--net", "mlp", "--images", "64", "--samples", "4", "--data", "{data}",
                      "--families", "diagonal", "map"], ["diagonal", "map"]),
    "predict_memory": (["--widths", "64", "--samples", "8", "--rows", "16"], ["55,050"]),
    "against_map": (["--problems", "digits", "--families", "diagonal", "--budgets", "1",
                     "--seeds", "0", "--processes", "1"], ["digits"]),
    "trained_network": (["finetune", "prior", "scratch", "--train", "128", "--test", "32",
                         "--epochs", "1", "--steps", "2", "--families", "diagonal", "map",
                         "--draws", "2", "--data-root", "{data}"],
                        ["the network", "diagonal", "diagonal, init='fresh'",
                         "last layer (lowrank), frozen body", "torchvision ResNet-18",
                         "N(0, 1)", "N(0, 2 / fan_in)"]),
    "reference": (["--datasets", "moons", "--chains", "2", "--warmup", "10", "--draws", "6",
                   "--families", "diagonal", "map", "--max-tree-depth", "5", "--quiet",
                   "--workdir", "{tmp}/chains"], ["diagonal", "map", "HMC reference"]),
    "depth": (["--depths", "1", "--chains", "2", "--warmup", "10", "--draws", "10",
               "--max-tree-depth", "4", "--num-steps", "20", "--workdir", "{tmp}/chains",
               "--quiet"], ["diagonal", "joint (all weights)", "HMC reference"]),
    "posch_pilz": (["--iterations", "4", "--limit", "256", "--test-limit", "50", "--samples",
                    "4", "--threads", "1", "--data", "{data}", "--checkpoints", "{tmp}/ckpt"],
                   ["zoo, tridiagonal, 100 units", "paper, Bayesian, 100 units"]),
    "regression": (["--datasets", "linnerud", "--splits", "1", "--families", "diagonal",
                    "--priors", "default", "--num-steps", "5", "--samples", "4", "--workers",
                    "1"], ["linnerud"]),
    "baselines": (["--data", "{data}", "--train-limit", "256", "--test-limit", "64", "--ood",
                   "32", "--samples", "4", "--rows", "diagonal", "map"], ["diagonal", "map"]),
    "scaling": (["--processes", "1", "--steps", "2", "--warmup", "1", "--limit", "256",
                 "--batch", "16", "--data", "{data}"], ["1"]),
}  # fmt: skip


def _run(*args: str, timeout: float = HANG_AFTER, env: dict | None = None) -> str:
    proc = WARM.run(list(args), cwd=REPO, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # a pool's workers killed at its end (Pool.terminate) leave their semaphores (tqdm's lock)
    assert "leaked semaphore" not in proc.stderr, proc.stderr[-3000:]
    return proc.stdout


def _tiny(name: str, tmp_path, mnist_root) -> tuple[list[str], str]:
    """``name``'s tiny arguments with its ``--out``, and the path its result lands at."""
    args = [a.format(tmp=tmp_path, data=mnist_root) for a in TINY[name][0]]
    if name == "posch_pilz":  # its --out is the folder of runs; the result sits beside it
        return [*args, "--out", str(tmp_path / "runs")], str(tmp_path / "runs.json")
    return [*args, "--out", str(tmp_path / f"{name}.json")], str(tmp_path / f"{name}.json")


def test_every_script_has_a_tiny_run():
    assert set(TINY) == set(suite.SCRIPTS)


@pytest.mark.parametrize("name", list(suite.SCRIPTS))
def test_each_script_runs_and_writes_its_result(name, tmp_path, mnist_root):
    args, out = _tiny(name, tmp_path, mnist_root)
    printed = _run(f"benchmarks/{name}.py", *args, env={**os.environ, "ZOO_DATA": str(mnist_root)})
    result = json.loads(Path(out).read_text())
    assert result["name"] == name and result["question"] == suite.SCRIPTS[name]
    command = result["command"] if isinstance(result["command"], str) else result["command"][-1]
    assert command.startswith(f"python benchmarks/{name}.py ")
    assert result["machine"]["cores"] >= 1 and result["machine"]["torch"]
    tables = [b for b in result["blocks"] if "columns" in b]
    assert tables, printed
    for table in tables:
        assert table["rows"] and all(len(row) == len(table["columns"]) for row in table["rows"])
    first_cells = {row[0] for table in tables for row in table["rows"]}
    for label in TINY[name][1]:
        assert any(cell.startswith(label) for cell in first_cells), (label, first_cells)
    section = "\n".join(suite.section(result))
    assert f"`{command}`" in section or command in section


def test_step_time_leaves_out_a_subnetwork_larger_than_the_network_and_refuses_bad_times(
    tmp_path,
):
    """The tiny net has 751 weights: S=256 is timed, S=1024 and S=4096 (which the guide
    refuses) are left out with a line, not a crash of the whole run; a zero or negative median
    is refused, not printed."""
    args = ["--net", "tiny", "--rounds", "1", "--steps", "2", "--only", "subnetwork"]
    out = _run("benchmarks/step_time.py", *args, "--out", str(tmp_path / "s.json"))
    assert "| zoo subnetwork S=256 |" in out
    for size in ("1024", "4096"):
        assert f"zoo subnetwork S={size}: more than the network's 751 weights" in out
        assert f"| zoo subnetwork S={size} |" not in out
    with pytest.raises(SystemExit, match="not printed"):
        step_time.check_times({"zoo diagonal": [0.0, -1e-3, 0.0]})


def test_step_memory_sets_the_peak_beside_the_count(tmp_path):
    out = tmp_path / "m.json"
    _run("benchmarks/step_memory.py", "--width", "300", "--families", "diagonal", "--out", str(out))
    (table,) = [b for b in json.loads(out.read_text())["blocks"] if "columns" in b]
    (cells,) = table["rows"]
    counted, peak, ratio = (float(c.replace(",", "")) for c in cells[3:6])
    assert counted > 0 and peak > 0  # MiB, rounded: the ratio is of the exact bytes
    assert (peak - 0.5) / (counted + 0.5) - 0.01 <= ratio <= (peak + 0.5) / (counted - 0.5)


def test_against_map_merges_a_later_run_into_the_rows_it_held(tmp_path):
    out = tmp_path / "against_map.json"
    args = ["--problems", "digits", "--budgets", "1", "--seeds", "0", "--processes", "1"]
    _run("benchmarks/against_map.py", *args, "--families", "diagonal", "--out", str(out))
    first = json.loads(out.read_text())
    rows = first["data"]["rows"]
    assert [r["family"] for r in rows] == ["map", "plain", "diagonal"]
    assert rows[-1]["recipe"].endswith("MAP start") and rows[0]["recipe"].endswith("measured")
    for r in rows:
        assert 0 < r["accuracy"] <= 1 and r["nll"] > 0 and 0 <= r["ood_auroc"] <= 1
    _run("benchmarks/against_map.py", *args, "--families", "mc_dropout", "--no-plain",
         "--out", str(out))  # fmt: skip
    second = json.loads(out.read_text())
    families = [r["family"] for r in second["data"]["rows"]]
    assert sorted(families) == ["diagonal", "map", "mc_dropout", "plain"]  # map ran again
    assert second["data"]["rows"][families.index("diagonal")] == rows[-1]  # kept as it was
    assert second["command"] == [first["command"], second["command"][-1]]
    assert "--families mc_dropout" in second["command"][-1]


def test_regression_resumes_from_its_checkpoint(tmp_path):
    args = ["--datasets", "linnerud", "--splits", "1", "--families", "diagonal", "--priors"]
    args += ["default", "--num-steps", "5", "--samples", "4", "--workers", "1"]
    checkpoint = tmp_path / "fits.jsonl"
    first = _run("benchmarks/regression.py", *args, "--checkpoint", str(checkpoint),
                 "--out", str(tmp_path / "a.json"))  # fmt: skip
    fits = [json.loads(line) for line in checkpoint.read_text().splitlines()]
    assert sorted(f["label"] for f in fits) == ["deterministic", "diagonal"]
    second = _run("benchmarks/regression.py", *args, "--checkpoint", str(checkpoint),
                  "--out", str(tmp_path / "b.json"))  # fmt: skip
    assert "2 fits read from" in second and "0 to run" in second
    assert len(checkpoint.read_text().splitlines()) == 2  # nothing fitted twice
    table = [line for line in first.splitlines() if line.startswith("| linnerud")]
    assert table == [line for line in second.splitlines() if line.startswith("| linnerud")]
    a, b = (json.loads((tmp_path / f).read_text()) for f in ("a.json", "b.json"))
    tables = [[b for b in r["blocks"] if "columns" in b] for r in (a, b)]
    assert tables[0] == tables[1] and a["data"] == b["data"]


def test_posch_pilz_resumes_to_the_uninterrupted_run(tmp_path, mnist_root):
    args = ["--limit", "256", "--test-limit", "50", "--samples", "4", "--threads", "1"]
    args += ["--data", str(mnist_root), "--checkpoint-every", "5"]

    def where(name: str) -> list[str]:
        return ["--out", str(tmp_path / name), "--checkpoints", str(tmp_path / f"{name}-ckpt")]

    out = _run("benchmarks/posch_pilz.py", *args, *where("whole"), "--iterations", "12")
    assert "| zoo, tridiagonal, 100 units | " in out
    whole = json.loads((tmp_path / "whole" / "tridiagonal_100.json").read_text())
    posch_pilz.run(posch_pilz.parse([*args, *where("split"), "--iterations", "6"]))  # to step 6
    resumed = posch_pilz.run(posch_pilz.parse([*args, *where("split"), "--iterations", "12"]))
    assert whole["iterations"] == resumed["iterations"] == 12  # continued from step 6
    for key in ("test_error", "nll", "ece", "certainty", "tau_rho", "examples", "loss_curve"):
        assert whole[key] == resumed[key], key
    assert sum(whole["certainty"].values()) == whole["test_size"] == 50
    assert set(whole["tau_rho"]) == {"conv1", "conv2", "fc1", "fc2"}
    assert whole["paper"]["test_error"]["bayesian"] == 0.007
    assert whole["command"].startswith("python benchmarks/posch_pilz.py --limit 256 ")
    saved = zoo.load(tmp_path / "whole" / "tridiagonal_100.fit")
    assert saved.steps == 12 and saved.options["batch_size"] == 64
    diagonal = posch_pilz.run(
        posch_pilz.parse([*args, *where("d"), "--iterations", "2", "--family", "diagonal"])
    )
    assert diagonal["tau_rho"] is None and "lr_multipliers" not in posch_pilz.recipe("diagonal")
    page = json.loads((tmp_path / "whole.json").read_text())
    assert page["name"] == "posch_pilz" and "Learned tau / rho" in json.dumps(page["blocks"])


def test_reference_merges_each_data_set_into_its_result(tmp_path):
    out = tmp_path / "ref.json"
    common = ["--chains", "2", "--warmup", "10", "--draws", "6", "--max-tree-depth", "5"]
    common += ["--quiet", "--workdir", str(tmp_path / "chains"), "--out", str(out)]
    _run("benchmarks/reference.py", "--datasets", "moons", "--families", "map", *common)
    _run("benchmarks/reference.py", "--datasets", "diabetes", "--families", "map", *common)
    saved = json.loads(out.read_text())
    assert set(saved["data"]) == {"moons", "diabetes"}
    assert saved["data"]["moons"]["reference"]["draws"] == 6
    assert set(saved["data"]["moons"]["table"]) == {"map", "HMC reference"}
    texts = [b["text"] for b in saved["blocks"] if "text" in b]
    assert [t.split(":")[0] for t in texts] == ["moons", "diabetes"]
    assert len(saved["command"]) == 2
