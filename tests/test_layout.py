"""The shape of the code: a one-way import graph in guides/, small modules, documented API."""

import ast
import dataclasses
import inspect
import sys
from pathlib import Path

import pytest

import guides
import zoo

REPO = Path(__file__).resolve().parents[1]
#: guides/ modules in import order: each may import only those before it. ``posch_joint`` is
#: a kernel module like ``kernels`` (the Posch ratio table and the joint draw; torch only), as
#: is ``lowrank_kernels``.
GUIDES_LAYERS = [
    "checks",  # the primitive argument checks of the whole library (zoo.arguments re-exports)
    "memory",  # what a family's fit takes, counted before allocating
    "registry",
    "lowrank_kernels",
    "kernels",
    "posch_joint",
    "gaussian",
    "walsh_hadamard",  # the transform and WHVI's weight distribution
    "site",
    "initial",  # a guide's initial means and scales
    "names",  # the Pyro names of live guides
    "joint_gaussian",
    "base",
    "pairs",  # what an optimiser may read of a posterior
    "joint",  # one Gaussian across sites: a guide the subnetwork family builds on
]


def imported_guides_modules(path: Path) -> set[str]:
    """The ``guides`` modules ``path`` imports, by their names in :data:`GUIDES_LAYERS` or as
    families (``guides.families.joint`` is ``joint``)."""
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in ("guides", "guides.families"):
            names.update(a.name for a in node.names)  # from guides import registry
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("guides"):
            names.add(node.module.removeprefix("guides.").removeprefix("families."))
        elif isinstance(node, ast.Import):
            names.update(
                a.name.removeprefix("guides.").removeprefix("families.")
                for a in node.names
                if "guides" in a.name
            )
    return names


def guides_path(name: str) -> Path:
    """The file of ``guides`` module ``name``: a family's in ``guides/families/``."""
    family = REPO / "guides" / "families" / f"{name}.py"
    return family if family.exists() else REPO / "guides" / f"{name}.py"


def test_guides_is_a_one_way_graph():
    families = {p.stem for p in (REPO / "guides" / "families").glob("*.py")} - {
        *GUIDES_LAYERS,
        "__init__",
        "mixed",
    }
    assert not {p.stem for p in (REPO / "guides").glob("*.py")} & families  # all in families/
    for i, layer in enumerate(GUIDES_LAYERS):
        imported = imported_guides_modules(guides_path(layer))
        assert imported <= set(GUIDES_LAYERS[:i]), (layer, imported)
    for family in families:  # a family knows the layers, never another family
        imported = imported_guides_modules(guides_path(family))
        assert imported <= set(GUIDES_LAYERS), (family, imported)


def module_imports(repo: Path | None = None) -> dict[str, set[str]]:
    """``module -> the zoo/guides modules it imports`` anywhere in it: at module level and
    inside functions (an import in a function closes a circle as surely, only later), outside
    ``if TYPE_CHECKING`` blocks (annotations only)."""
    repo = repo or REPO
    paths = {}
    for package in ("zoo", "guides"):
        for path in (repo / package).rglob("*.py"):
            parts = path.relative_to(repo).with_suffix("").parts
            paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def known(name: str) -> str | None:  # the module a dotted name lives in
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, path in paths.items():
        targets = set()
        for node in _imports_outside_type_checking(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(known(a.name) for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets.update(known(f"{node.module}.{a.name}") for a in node.names)
        graph[module] = targets - {None, module}
    return graph


def _imports_outside_type_checking(tree: ast.AST):
    """Every import statement of ``tree``, at any depth, except under ``if TYPE_CHECKING``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (n for child in node.orelse for n in _imports_outside_type_checking(child))
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        yield from _imports_outside_type_checking(node)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (``[a, b, ..., a]``), or None (a depth-first search)."""
    visiting, done = [], set()

    def visit(module):
        if module in visiting:
            return visiting[visiting.index(module) :] + [module]
        if module in done:
            return None
        visiting.append(module)
        for target in sorted(graph.get(module, ())):
            cycle = visit(target)
            if cycle:
                return cycle
        visiting.pop()
        done.add(module)
        return None

    return next((c for c in map(visit, sorted(graph)) if c), None)


#: zoo's packages and public top-level modules in import order: each may import ``guides`` and
#: what comes before it, never what comes after (at module level or inside a function).
#: ``zoo/__init__.py`` and ``__main__`` gather the public names and may import any of them.
ZOO_LAYERS = [
    "arguments",  # the checks of plain arguments (check_int, check_bool, ...)
    "runtime",  # seeding, one call at a time, processes, threads, distributed ranks
    "metrics",  # formulas on tensors (the likelihoods' metrics)
    "priors",
    "models",  # networks, likelihoods, what a prediction holds
    "storage",  # the file format: plain data, atomic writes, checks, each saved form
    "data",  # data sets, checks of data in every form, minibatches, fingerprints
    "inference",  # the objective (-ELBO), its scaling, estimators, how the loss is evaluated
    "evaluation",  # predictives, agreement with a reference, figures, the ArviZ bridge
    "results",  # every kind of posterior (one interface), saving and zoo.load
    "mcmc",  # reference posteriors: samplers, chains
    "training",  # zoo.fit: options, the loop, the step engine and its rules, checkpoints
    "baselines",  # deep ensembles, the Laplace approximation
    "comparison",
    "lightning",
    "cli",  # only the command line imports the command line
]
#: Public module names kept where users import them (``import zoo.plots``): each makes the
#: module of its package importable under that name and holds nothing else.
PUBLIC_ALIASES = {"plots": "evaluation", "arviz": "evaluation"}


def zoo_layer(module: str) -> str | None:
    """The entry of :data:`ZOO_LAYERS` that holds ``module`` (``zoo.training.step`` ->
    ``training``); None for ``zoo`` itself, ``zoo.__main__`` and modules outside zoo."""
    parts = module.split(".")
    if parts[0] != "zoo" or len(parts) < 2 or parts[1] == "__main__":
        return None
    return PUBLIC_ALIASES.get(parts[1], parts[1]) if len(parts) == 2 else parts[1]


def all_imports(path: Path, module: str) -> set[str]:
    """Every module ``path`` imports, anywhere in it (a relative import resolved)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            base = node.module
            if node.level:
                base = ".".join(module.split(".")[: -node.level] + [node.module])
            found.update(f"{base}.{a.name}" for a in node.names)
    return found


def layer_violations() -> list[str]:
    order = {name: i for i, name in enumerate(ZOO_LAYERS)}
    bad = []
    for path in (REPO / "zoo").rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        own = zoo_layer(module)
        if own is None:
            continue
        for target in all_imports(path, module):
            if target == "zoo" and own != "cli":  # the public names: only the front end
                bad.append(f"{module} imports zoo ({own} -> the whole package)")
            other = zoo_layer(target)
            if other is None or other == own:
                continue
            if order.get(other, len(order)) > order[own]:
                bad.append(f"{module} imports {target} ({own} -> {other})")
    return sorted(bad)


def test_zoo_is_packages_in_one_import_order():
    top = {p.stem for p in (REPO / "zoo").iterdir() if p.suffix == ".py" or p.is_dir()}
    top -= {"__init__", "__main__", "__pycache__", *PUBLIC_ALIASES}
    assert top == set(ZOO_LAYERS), top ^ set(ZOO_LAYERS)
    for alias in PUBLIC_ALIASES:  # an alias holds nothing of its own
        text = (REPO / "zoo" / f"{alias}.py").read_text()  # the module, and its names for checkers
        assert len(text.splitlines()) <= 11 and "def " not in text and "class " not in text, alias
    assert len([p for p in (REPO / "zoo").glob("*.py")]) <= 10
    for name in ZOO_LAYERS:  # a package's job is in its docstring
        path = REPO / "zoo" / name / "__init__.py"
        path = path if path.exists() else REPO / "zoo" / f"{name}.py"
        assert ast.get_docstring(ast.parse(path.read_text())), name
    violations = layer_violations()
    assert not violations, "\n".join(violations)


def test_the_layer_check_sees_an_import_that_climbs(tmp_path, monkeypatch):
    """A module of ``runtime`` that imports ``training`` inside a function is reported."""
    fake = tmp_path / "zoo" / "runtime"
    fake.mkdir(parents=True)
    (fake / "x.py").write_text("def f():\n    from zoo.training import step\n")
    (tmp_path / "zoo" / "cli.py").write_text("import zoo\nfrom zoo import metrics\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    assert layer_violations() == ["zoo.runtime.x imports zoo.training.step (runtime -> training)"]


def test_no_import_cycle_in_zoo_or_guides():
    graph = module_imports()
    assert "zoo.priors.fitted" in graph["zoo.priors"]  # the graph is read, not empty
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_check_reads_imports_inside_functions(tmp_path):
    """A circle closed by an import inside a function is a circle: the graph holds the edge
    and the search finds it."""
    for package in ("zoo", "guides"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "zoo" / "a.py").write_text("from zoo import b\n")
    (tmp_path / "zoo" / "b.py").write_text("def f():\n    from zoo.a import g\n")
    graph = module_imports(tmp_path)
    assert graph["zoo.b"] == {"zoo.a"}
    assert find_cycle(graph) == ["zoo.a", "zoo.b", "zoo.a"]


def test_the_cycle_check_finds_a_cycle():
    graph = {"zoo.a": {"zoo.b"}, "zoo.b": {"zoo.c"}, "zoo.c": {"zoo.a"}, "zoo.d": {"zoo.a"}}
    assert find_cycle(graph) == ["zoo.a", "zoo.b", "zoo.c", "zoo.a"]
    assert find_cycle({"zoo.a": {"zoo.b"}, "zoo.b": set()}) is None


@pytest.mark.parametrize("package", ["zoo", "guides"])
def test_no_module_over_400_lines(package):
    for path in (REPO / package).rglob("*.py"):
        lines = len(path.read_text().splitlines())
        assert lines <= 400, f"{path.relative_to(REPO)} has {lines} lines"


def public_objects():
    for module in (
        zoo,
        guides,
        zoo.models,
        zoo.models.likelihoods,
        zoo.priors,
        zoo.metrics,
        zoo.data,
    ):
        for name in getattr(module, "__all__", None) or dir(module):
            obj = getattr(module, name)
            if name.startswith("_") or inspect.ismodule(obj):
                continue
            if (inspect.isclass(obj) or inspect.isfunction(obj)) and obj.__module__.startswith(
                ("zoo", "guides")
            ):
                yield f"{module.__name__}.{name}", obj


def test_every_public_class_and_function_has_a_docstring():
    missing = [name for name, obj in public_objects() if not inspect.getdoc(obj)]
    assert not missing, missing
    for name, obj in public_objects():
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if attr.startswith("_") or not inspect.isfunction(member):
                    continue
                assert inspect.getdoc(getattr(obj, attr)), f"{name}.{attr}"


def test_no_module_is_named_like_a_function_it_exports():
    import importlib

    for path in (REPO / "zoo").rglob("*.py"):
        if path.stem in ("__main__", "__init__"):
            continue
        name = ".".join(path.relative_to(REPO).with_suffix("").parts)
        module = importlib.import_module(name)
        parent = importlib.import_module(name.rpartition(".")[0])
        assert not inspect.isfunction(getattr(parent, path.stem, None)), name
        assert not inspect.isfunction(getattr(zoo, path.stem, None)), name
        assert path.stem not in getattr(module, "__all__", []), name


def optimizer_step_calls(source: str) -> list[int]:
    """Lines of ``source`` that call ``.step()`` on an optimiser (a name with "opt" in it)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "step" and "opt" in ast.unparse(node.func.value).lower():
                lines.append(node.lineno)
    return lines


def test_the_step_engine_is_the_only_caller_of_optimizer_step():
    """One body takes the update (zoo/training/step.py); no other module of the library does."""
    callers = {
        str(path.relative_to(REPO)): found
        for package in ("zoo", "guides")
        for path in (REPO / package).rglob("*.py")
        if (found := optimizer_step_calls(path.read_text()))
    }
    assert (
        list(callers) == ["zoo/training/step.py"] and len(callers["zoo/training/step.py"]) == 1
    ), callers
    # the scan finds calls, not mentions
    assert optimizer_step_calls("self.optimizer.step()\nopt.step()\n'opt.step()'\n") == [1, 2]


def test_fit_takes_at_most_twelve_parameters_and_its_groups_are_shared():
    """zoo.fit's few arguments plus one parameter per option group; BayesianModule and the
    command line take the same groups (the CLI's flags are the groups' declared ones)."""
    from zoo.cli.commands import build_parser
    from zoo.lightning import BayesianModule
    from zoo.training.options import GROUPS

    params = inspect.signature(zoo.fit).parameters
    assert len(params) <= 12, list(params)
    assert set(GROUPS) <= set(params)
    module = inspect.signature(BayesianModule.__init__).parameters
    assert {"optim", "loss"} <= set(module)
    fit_flags = {
        a.dest for a in build_parser()._subparsers._group_actions[0].choices["fit"]._actions
    }
    for cls in GROUPS.values():
        for field in dataclasses.fields(cls):
            if "cli" in field.metadata:
                assert field.name in fit_flags, (cls.__name__, field.name)


@pytest.mark.slow  # quick tier: under three minutes
def test_the_optional_modules_resolve_as_attributes_of_zoo():
    """``import zoo`` then ``zoo.lightning.BayesianModule``, as the README writes it."""
    import subprocess
    import sys

    code = "import zoo; print(zoo.plots.__name__, zoo.arviz.__name__, zoo.lightning.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["zoo.evaluation.plots", "zoo.evaluation.arviz", "zoo.lightning"]


#: Stacks that ``import zoo`` and ``python -m zoo --help`` must not load: each costs seconds of
#: every process a user starts (a Lightning rank, an HMC chain, a command-line call), and only
#: the functions that need one import it.
HEAVY_MODULES = (
    "arviz",
    "lightning",
    "matplotlib",
    "pandas",
    "scipy",
    "tabulate",
    "torch._dynamo",
    "torchmetrics",
    "torchvision",
    "xarray",
)


@pytest.mark.parametrize("entry", ["import zoo", "python -m zoo --help"])
@pytest.mark.slow  # quick tier: under three minutes
def test_importing_zoo_loads_no_heavy_stack(entry):
    import subprocess
    import sys

    code = (
        "import runpy, sys\n"
        + (
            "import zoo\n"
            if entry == "import zoo"
            else "sys.argv = ['zoo', '--help']\n"
            "try:\n    runpy.run_module('zoo', run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
        )
        + f"print(sorted(m for m in sys.modules if m in {HEAVY_MODULES!r}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout[-500:]
    # the check sees a heavy stack when one loads
    probe = "import sys, zoo.plots; print('matplotlib' in sys.modules)"
    seen = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO)
    assert seen.stdout.strip() == "True", seen.stderr


#: The hooks Pyro made for subclasses: an effect handler's (a Messenger subclass overrides
#: them) and an AutoGuide's set-up (every AutoGuide of Pyro's own overrides it); and what
#: Python's abc module sets on every subclass.
PYRO_HOOKS = {"_process_message", "_postprocess_message", "_setup_prototype", "_abc_impl"}


def test_no_private_pyro_method_is_overridden():
    """The library builds on Pyro's public API: no class of zoo or guides overrides a private
    method of a Pyro base class (the effect handlers' own hooks aside)."""
    import importlib

    overridden = []
    for package in ("zoo", "guides"):
        for path in (REPO / package).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            if parts[-1] == "__main__":
                continue
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            module = importlib.import_module(name)
            for cls in vars(module).values():
                if not inspect.isclass(cls) or cls.__module__ != name:
                    continue
                for base in cls.__mro__[1:]:
                    if not base.__module__.startswith("pyro"):
                        continue
                    for attr in vars(cls):
                        private = attr.startswith("_") and not attr.startswith("__")
                        if private and attr in vars(base) and attr not in PYRO_HOOKS:
                            overridden.append(f"{name}.{cls.__name__}.{attr} ({base.__name__})")
    assert not overridden, overridden


#: Test modules named for what they check across a package rather than for one module.
TEST_TOPICS = {
    "tests/zoo/test_cuda.py": "every GPU rule, on a GPU",
    "tests/zoo/data/test_mnist.py": "fits on the real MNIST files (zoo.data.sets)",
    "tests/zoo/baselines/test_ensemble_rate.py": "an ensemble's members share one rate",
    "tests/zoo/training/test_conjugate_families.py": "every family against an exact posterior",
    "tests/zoo/training/test_validation.py": "bad input refused before a fit's first step",
    "tests/zoo/training/test_host_sync.py": "no host read in any family's compiled loss",
    "tests/zoo/models/test_models.py": "every family on every network of zoo.models",
    "tests/zoo/models/test_networks.py": "the networks of zoo.models against PyTorch's",
    "tests/zoo/models/test_any_network.py": "torchvision's and users' networks converted",
    "tests/zoo/models/test_whole_library.py": "every entry point on a ResNet",
}


def test_the_tests_mirror_the_packages():
    """``tests/zoo/<package>/test_<module>.py`` tests ``zoo/<package>/<module>.py`` (and
    ``tests/zoo/test_<module>.py`` a top-level module); a test named for a topic says so in
    :data:`TEST_TOPICS`."""
    stray = []
    for path in sorted((REPO / "tests" / "zoo").rglob("test_*.py")):
        where = path.relative_to(REPO / "tests")  # zoo/<package>/test_<module>.py
        module = REPO / where.parent / f"{path.stem.removeprefix('test_')}.py"
        name = str(path.relative_to(REPO))
        if not module.exists() and name not in TEST_TOPICS:
            stray.append(name)
    assert not stray, f"tests named for no module (rename, or add to TEST_TOPICS): {stray}"
    for topic in TEST_TOPICS:
        assert (REPO / topic).exists(), topic
    for folder in (REPO / "tests" / "zoo").iterdir():
        if folder.is_dir() and folder.name != "__pycache__":
            assert (REPO / "zoo" / folder.name / "__init__.py").exists(), folder.name


def allowed_inner_imports() -> list[str]:
    """The modules ruff's configuration allows inside a function (``PLC0415`` exempts what
    ``banned-module-level-imports`` lists)."""
    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]
    assert {"PLC0415", "TID253"} <= set(config["select"])
    return config["flake8-tidy-imports"]["banned-module-level-imports"]


def inner_imports(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every import inside a function or class of ``path``."""
    found = []
    for scope in ast.walk(ast.parse(path.read_text())):
        if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for node in ast.walk(scope):
            if isinstance(node, ast.Import):
                found += [(node.lineno, a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:  # a module, or its member
                found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return sorted(set(found))


def test_the_library_imports_at_the_top_but_the_listed_stacks():
    """An import inside a function of zoo/ or guides/ is one of the allowed stacks, each for
    its reason (pyproject.toml: optional or heavy, POSIX-only, a private name wrapped once),
    an independent reading of ruff's rule."""
    allowed = allowed_inner_imports()
    assert "pandas" in allowed and "zoo.evaluation.plots" in allowed and "torch" not in allowed
    stray = [
        f"{path.relative_to(REPO)}:{line} imports {module}"
        for package in ("zoo", "guides")
        for path in sorted((REPO / package).rglob("*.py"))
        for line, module in inner_imports(path)
        if not any(module == a or module.startswith(a + ".") for a in allowed)
    ]
    assert not stray, stray


def test_the_inner_import_check_sees_one(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import os\n\n\ndef f():\n    import json\n    import pandas\n")
    module.write_text(module.read_text() + "    from zoo.evaluation import plots\n")
    assert inner_imports(module) == [(5, "json"), (6, "pandas"), (7, "zoo.evaluation.plots")]
