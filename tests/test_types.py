"""The type hints users and their type checkers read: every callable of the public API (the
``__all__`` of ``zoo``, ``guides``, ``zoo.models``, ``zoo.priors``, ``zoo.data``, the public
functions of ``zoo.metrics`` and ``zoo.plots``, their classes' public methods) is annotated in
full, and
mypy (configured in ``pyproject.toml``: bodies of unannotated functions checked too) passes over
``zoo/`` and ``guides/``."""

import inspect
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import guides
import zoo
import zoo.plots

REPO = Path(__file__).resolve().parents[1]


def exported(module) -> list[str]:
    """``module.__all__``, or the public functions and classes defined in it."""
    if hasattr(module, "__all__"):
        return list(module.__all__)
    return [
        name
        for name, obj in vars(module).items()
        if not name.startswith("_")
        and (inspect.isfunction(obj) or inspect.isclass(obj))
        and obj.__module__ == module.__name__
    ]


PUBLIC = (zoo, guides, zoo.models, zoo.priors, zoo.data, zoo.metrics, zoo.plots)


def public_api():
    """``(dotted path, function)`` of every function of the public API: the public modules'
    functions and classes, each class's ``__init__`` and public methods (its own, and those it
    inherits from another class of the packages)."""
    seen = set()
    for package in PUBLIC:
        for name in exported(package):
            obj = getattr(package, name)
            if inspect.isfunction(obj):
                yield f"{package.__name__}.{name}", obj
            if not inspect.isclass(obj):
                continue
            for attr in dir(obj):
                if attr.startswith("_") and attr != "__init__":
                    continue
                member = inspect.getattr_static(obj, attr)
                if isinstance(member, (classmethod, staticmethod)):
                    member = member.__func__
                if isinstance(member, property):
                    member = member.fget
                module = getattr(member, "__module__", "") or ""
                if not inspect.isfunction(member) or not module.startswith(("zoo", "guides")):
                    continue  # torch's, Pyro's: not ours to annotate
                if member not in seen:
                    seen.add(member)
                    yield f"{package.__name__}.{name}.{attr}", member


def unannotated(function) -> list[str]:
    """What ``function`` leaves without a hint: its parameters' names, and ``"return"``."""
    signature = inspect.signature(function)
    missing = [
        name
        for name, p in signature.parameters.items()
        if name not in ("self", "cls") and p.annotation is inspect.Parameter.empty
    ]
    if function.__name__ != "__init__" and signature.return_annotation is inspect.Parameter.empty:
        missing.append("return")
    return missing


def test_the_check_finds_a_missing_hint():
    def half(x: int, y, *args, **kwargs: int):
        return x

    assert unannotated(half) == ["y", "args", "return"]


def test_every_public_callable_is_annotated_in_full():
    functions = list(public_api())
    assert len(functions) > 200, len(functions)  # the walk reaches the classes' methods
    missing = [f"{path}: {unannotated(f)}" for path, f in functions if unannotated(f)]
    assert not missing, "annotate these:\n" + "\n".join(missing)


@pytest.mark.slow  # mypy over 114 modules: about a minute on two cores
def test_mypy_passes_over_zoo_and_guides():
    mypy = shutil.which("mypy", path=os.path.dirname(sys.executable)) or shutil.which("mypy")
    if mypy is None:
        pytest.fail("mypy is not installed: pip install -e '.[dev]'")
    run = subprocess.run(
        [mypy, "--no-incremental", "--python-executable", sys.executable],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]


def test_every_producer_takes_zoo_fits_one_signature_of_how_to_fit():
    """zoo.training.keywords.HowToFit holds zoo.fit's arguments after the model, guide and
    data, with zoo.fit's annotations; zoo.laplace, zoo.subnetwork_guide and zoo.compare take it
    as **how, zoo.ensemble FitLength (the same, its seed its own): one signature, one
    docstring."""
    from typing import get_type_hints

    from typing_extensions import Unpack

    from zoo.training import keywords

    fit_params = inspect.signature(zoo.fit).parameters
    keyword_only = [n for n, p in fit_params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    assert sorted(keyword_only) == sorted(keywords.HowToFit.__annotations__)
    fit_hints = get_type_hints(inspect.unwrap(zoo.fit))
    how_hints = get_type_hints(keywords.HowToFit)
    for name in keyword_only:
        assert how_hints[name] == fit_hints[name], name
    assert set(keywords.FitLength.__annotations__) == set(keyword_only) - {"seed"}
    producers = {zoo.laplace: keywords.HowToFit, zoo.subnetwork_guide: keywords.HowToFit,
                 zoo.compare: keywords.HowToFit, zoo.ensemble: keywords.FitLength}  # fmt: skip
    for producer, typed in producers.items():
        params = inspect.signature(inspect.unwrap(producer)).parameters
        assert not set(params) & set(keyword_only) - {"seed"}, producer.__name__
        how = params["how"]
        assert how.kind is inspect.Parameter.VAR_KEYWORD, producer.__name__
        assert how.annotation in (f"Unpack[{typed.__name__}]", Unpack[typed]), how.annotation
    with pytest.raises(TypeError, match="laplace\\(\\) got an unexpected keyword argument 'epoch'"):
        zoo.laplace(zoo.models.BayesianMLP(2, (3,), 2, task="classification"),
                    (torch.zeros(4, 2), torch.zeros(4, dtype=torch.long)), epoch=3)  # fmt: skip
