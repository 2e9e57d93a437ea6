"""The benchmark suite's one helper: each script's run kept as one JSON, the page made from them.

A script measures inside :func:`record`, printing its tables as markdown::

    with suite.record("width", out=args.out) as run:
        print("| family | ms |")
        print("| --- | ---: |")
        ...
        run.data = {...}  # optional: what a later run (to resume) or a notebook reads back

What the block prints still reaches the terminal; it is also kept, line by line, as text and
tables (a table: its header, each column's alignment, its rows, each cell as printed). When the
block ends without an exception, ``out`` (default ``benchmarks/results/<name>.json``) is written
atomically: the script's name and question, the command, the machine, the seconds, the printed
blocks and ``run.data``. A run that fails or is killed keeps the file it had.

``python benchmarks/suite.py`` renders every result into ``docs/benchmarks.md`` (the page of the
documentation site: each question, its command, its machine, its tables) after the findings of
the studies that left the tree (``benchmarks/findings.md``); ``--check`` exits 1, writing
nothing, when the page is not what the results render to.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
PAGE = HERE.parent / "docs" / "benchmarks.md"
FINDINGS = HERE / "findings.md"

#: The suite, in the page's order: each script's name and the question it answers.
SCRIPTS = {
    "step_time": "What does one step of each family cost against a deterministic step, the "
    "hand-written floor and the peers?",
    "step_memory": "What memory does each family's fit take against the count the library "
    "refuses a fit by?",
    "startup": "What does a fit cost before its first useful step?",
    "any_network": "What does each family cost on the networks users bring?",
    "width": "How does each family's step grow with the width of the network?",
    "predict_time": "How long does a prediction of many sampled networks take?",
    "predict_memory": "Does a prediction stay in bounded memory?",
    "against_map": "Is a Bayesian fit from scratch at least as good as the point estimate?",
    "trained_network": "What does a trained network keep when it is made Bayesian?",
    "reference": "How close does each family come to an HMC reference?",
    "depth": "Does the posterior's structure matter as the network deepens?",
    "posch_pilz": "Does the tridiagonal family reproduce Posch & Pilz's LeNet-5 results?",
    "regression": "How do the families and priors do on regression data?",
    "baselines": "How do the families compare with Laplace and a deep ensemble?",
    "scaling": "How do examples per second grow with processes on Lightning?",
}


def write_json(obj, path: str | os.PathLike, indent: int | None = 1) -> Path:
    """Write ``obj`` as JSON to ``path`` atomically: serialised in memory first (an object JSON
    cannot hold raises before the file is touched), then :func:`write_text`."""
    return write_text(json.dumps(obj, indent=indent) + "\n", path)


def write_text(text: str, path: str | os.PathLike) -> Path:
    """Write ``text`` to ``path`` atomically: to a temporary file in the same folder, flushed to
    disk and renamed over ``path``, so a reader never sees half a file and a kill mid-write
    keeps the previous file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, timeout=10,
                             capture_output=True, text=True, check=True)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def machine() -> dict:
    """The machine a run measures: CPU model and cores, the GPU (``None`` without one), the
    Python, torch and Pyro versions, torch's CPU threads and the 1-minute load average."""
    import pyro
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "gpu": gpu,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "pyro": pyro.__version__,
        "threads": torch.get_num_threads(),
        "load": round(os.getloadavg()[0], 2),
    }


def blocks(text: str) -> list[dict]:
    """The printed ``text`` as blocks: ``{"text": line}`` for a line, ``{"columns", "align",
    "rows"}`` for a markdown table (a run of lines starting with ``|``, the second its
    alignment row)."""

    def cells(line: str) -> list[str]:
        return [c.strip() for c in line.strip().strip("|").split("|")]

    out, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        line = lines[i]
        if (
            line.lstrip().startswith("|")
            and i + 1 < len(lines)
            and "-" in lines[i + 1]
            and set(lines[i + 1]) <= set("|-: ")
        ):
            table = {"columns": cells(line), "align": cells(lines[i + 1]), "rows": []}
            i += 2
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                table["rows"].append(cells(lines[i]))
                i += 1
            out.append(table)
            continue
        if line.strip():
            out.append({"text": line.strip()})
        i += 1
    return out


class _Tee(io.TextIOBase):
    def __init__(self, terminal):
        self.terminal, self.kept = terminal, io.StringIO()

    def write(self, s: str) -> int:
        self.kept.write(s)
        return self.terminal.write(s)

    def flush(self) -> None:
        self.terminal.flush()


class Run:
    """One run of a script: set :attr:`data` to what a later run or a notebook reads back, and
    :attr:`earlier` to the commands of earlier runs whose results this one merges."""

    def __init__(self):
        self.data, self.earlier = None, []


def _known(name: str) -> None:
    if name not in SCRIPTS:
        raise ValueError(f"{name!r} is not a script of the suite; add it to suite.SCRIPTS")


def markdown(columns: list[str], rows: list[list], align: list[str] | None = None) -> list[str]:
    """A markdown table's lines: ``columns``, then each row's cells (``str`` of each value); the
    alignment row from ``align`` (``"---"`` or ``"---:"`` per column; default: the first column
    left, the rest right)."""
    align = align or ["---"] + ["---:"] * (len(columns) - 1)
    return ["| " + " | ".join(columns) + " |", "| " + " | ".join(align) + " |"] + [
        "| " + " | ".join(str(c) for c in row) + " |" for row in rows
    ]


def save(name: str, printed: str | list[str], data=None, out: str | os.PathLike | None = None,
         argv: list[str] | None = None, machine_info: dict | None = None,
         seconds: float | None = None, earlier: list[str] = ()) -> Path:  # fmt: skip
    """Write ``name``'s result: ``printed`` (the text a run printed, or its lines) as blocks,
    ``data`` as is, the command from ``argv`` (default ``sys.argv[1:]``; after ``earlier``,
    the commands of the runs it merges, when there are any), ``machine_info`` (default
    :func:`machine` now), to ``out`` (default ``benchmarks/results/<name>.json``)."""
    _known(name)
    argv = sys.argv[1:] if argv is None else argv
    text = printed if isinstance(printed, str) else "\n".join(printed)
    result = {
        "name": name,
        "question": SCRIPTS[name],
        "command": _command(name, argv, list(earlier)),
        "commit": _commit(),
        "machine": machine_info or machine(),
        "seconds": None if seconds is None else round(seconds, 1),
        "blocks": blocks(text),
        "data": data,
    }
    return write_json(result, Path(out) if out is not None else RESULTS / f"{name}.json")


def _command(name: str, argv: list[str], earlier: list[str]) -> str | list[str]:
    command = shlex.join(["python", f"benchmarks/{name}.py", *argv])
    return [*[c for c in earlier if c != command], command] if earlier else command


@contextlib.contextmanager
def record(name: str, out: str | os.PathLike | None = None, argv: list[str] | None = None):
    """Keep what the block prints as ``name``'s result (see the module docstring); ``argv``: the
    arguments the script was called with (default ``sys.argv[1:]``)."""
    _known(name)
    run, start, before = Run(), time.time(), machine()
    tee = _Tee(sys.stdout)
    with contextlib.redirect_stdout(tee):
        yield run
    info = {**before, "load_after": round(os.getloadavg()[0], 2)}
    save(name, tee.kept.getvalue(), run.data, out, argv, info, time.time() - start, run.earlier)


def load(name: str, results: Path = RESULTS, out: str | os.PathLike | None = None) -> dict | None:
    """``name``'s saved result (from ``out`` when given), or ``None`` when it has none."""
    path = Path(out) if out is not None else results / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def commands(result: dict | None) -> list[str]:
    """The commands ``result`` holds (none for ``None``): a later run that merges into it passes
    them as ``earlier``."""
    if result is None:
        return []
    command = result["command"]
    return [command] if isinstance(command, str) else list(command)


def results_of(name: str, results: Path = RESULTS) -> list[dict]:
    """Every saved result of ``name``: ``<name>.json``, then each ``<name>-<where>.json`` (a
    run on another machine, say ``--out benchmarks/results/step_time-cuda.json``)."""
    paths = [results / f"{name}.json", *sorted(results.glob(f"{name}-*.json"))]
    return [json.loads(p.read_text()) for p in paths if p.exists()]


def _machine_line(m: dict) -> str:
    gpu = f", {m['gpu']}" if m.get("gpu") else ", no GPU"
    load = f"load {m['load']}" + (f" to {m['load_after']}" if "load_after" in m else "")
    return (f"{m['cpu']}, {m['cores']} cores{gpu}; Python {m['python']}, torch {m['torch']}, "
            f"Pyro {m['pyro']}, {m['threads']} torch threads; {load}")  # fmt: skip


def section(result: dict) -> list[str]:
    """One result's part of the page: its command, machine and printed blocks."""
    command = result["command"]
    if isinstance(command, str):
        lines = [f"`{command}`", ""]
    else:
        lines = ["The runs whose results merge here:", "", "```bash", *command, "```", ""]
    lines += [f"Machine: {_machine_line(result['machine'])}.", ""]
    for block in result["blocks"]:
        if "text" in block:
            lines += [block["text"], ""]
        else:
            lines += markdown(block["columns"], block["rows"], block["align"]) + [""]
    return lines


def render(results: Path = RESULTS, findings: Path = FINDINGS) -> str:
    """The page: how it is made, then per script of :data:`SCRIPTS` (in order) its question
    and each of its results (a script without one says so), then the findings."""
    lines = [
        "# Benchmarks",
        "",
        "<!-- generated by `python benchmarks/suite.py` from benchmarks/results/*.json -->",
        "",
        "Each section is one script of `benchmarks/`, run with the command it shows on the "
        "machine it names (the load is the 1-minute average before and after the run). Timings "
        "are ratios measured side by side in one run: read them within a table, not across "
        "tables. How to run the scripts: `benchmarks/README.md`.",
        "",
    ]
    for name, question in SCRIPTS.items():
        lines += [f"## {question}", ""]
        found = results_of(name, results)
        for result in found:
            lines += section(result)
        if not found:
            lines += [f"No result yet: run `python benchmarks/{name}.py`.", ""]
    if findings.exists():
        lines += findings.read_text().rstrip().split("\n")
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="render docs/benchmarks.md from the results")
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is stale")
    args = parser.parse_args(argv)
    page = render()
    if args.check:
        if not PAGE.exists() or PAGE.read_text() != page:
            print(f"{PAGE} is not what benchmarks/results renders to: run python "
                  "benchmarks/suite.py", file=sys.stderr)  # fmt: skip
            return 1
        return 0
    write_text(page, PAGE)
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
