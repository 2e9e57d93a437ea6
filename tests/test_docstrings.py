"""Every docstring of ``zoo`` and ``guides`` renders its parameters as parameters: parsed as the
documentation site parses it (Sphinx's napoleon, NumPy style), each documented parameter is a
name the callable takes. A paragraph left after the Parameters section (it belongs under
Notes) renders as pseudo-parameters with sentences for names, which ``sphinx -W`` does not
catch."""

import importlib
import inspect
import pkgutil
import re

import pytest

import guides
import zoo

NAME = re.compile(r"^\*{0,2}[A-Za-z_][A-Za-z0-9_]*$")


def documented_parameters(doc: str) -> list[str]:
    """The parameter names napoleon reads from a NumPy-style docstring."""
    from sphinx.ext.napoleon import Config
    from sphinx.ext.napoleon.docstring import NumpyDocstring

    config = Config(napoleon_use_param=True, napoleon_use_rtype=True)
    text = str(NumpyDocstring(doc, config, what="function"))
    names = []
    for field in re.findall(r"^:param (.+?):", text, flags=re.M):
        names += [name.strip() for name in field.replace("\\", "").split(",")]
    return names


def public_callables():
    """``(dotted path, object)`` of every public function, class and method defined in a module
    of ``zoo`` or ``guides`` (``__init__`` included: a class documents its parameters)."""
    for package in (zoo, guides):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if info.name.endswith("__main__"):
                continue
            module = importlib.import_module(info.name)
            for name, obj in vars(module).items():
                if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
                    continue
                if inspect.isfunction(obj) or inspect.isclass(obj):
                    yield f"{module.__name__}.{name}", obj
                if inspect.isclass(obj):
                    for attr, member in vars(obj).items():
                        if inspect.isfunction(member) and not attr.startswith("_"):
                            yield f"{module.__name__}.{name}.{attr}", member


def takes(obj) -> tuple[set[str], bool] | None:
    """The parameter names ``obj`` (a class: its ``__init__``) takes, and whether it takes any
    keyword (``**kwargs``); None when it has no signature to read."""
    try:
        signature = inspect.signature(obj.__init__ if inspect.isclass(obj) else obj)
    except (TypeError, ValueError):
        return None
    kinds = {p.kind for p in signature.parameters.values()}
    return set(signature.parameters), inspect.Parameter.VAR_KEYWORD in kinds


def test_the_check_catches_a_closing_paragraph_left_under_parameters():
    doc = "One line.\n\nParameters\n----------\nx : int\n    A number.\n\nThe end, a paragraph."
    assert documented_parameters(doc) == ["x", "The end", "a paragraph."]
    notes = doc.replace("\n\nThe end", "\n\nNotes\n-----\nThe end")
    assert documented_parameters(notes) == ["x"]


def test_every_documented_parameter_is_a_parameter():
    wrong = []
    for path, obj in public_callables():
        names = documented_parameters(inspect.cleandoc(obj.__doc__ or ""))
        signature = takes(obj)
        for name in names:
            if not NAME.match(name):
                wrong.append(f"{path}: {name[:60]!r} is not a name (a paragraph under Notes?)")
            elif signature and name.lstrip("*") not in signature[0] and not signature[1]:
                wrong.append(f"{path}: documents {name!r}, which it does not take")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize(
    "path",
    [
        "zoo.laplace",
        "zoo.ensemble",
        "zoo.load",
        "zoo.priors.LearnedNormalPrior",
        "guides.BlockDiagonalNormal",
    ],
)
def test_the_five_pages_that_rendered_garbled_document_names_only(path):
    module, name = path.rsplit(".", 1)
    obj = getattr(importlib.import_module(module), name)
    names = documented_parameters(inspect.cleandoc(obj.__doc__))
    assert names and all(NAME.match(n) for n in names), names
