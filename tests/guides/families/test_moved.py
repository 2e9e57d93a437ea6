"""The family modules live in ``guides/families/``; the old paths (``guides.tridiagonal``) are
aliases of them, so code and pickled files written before still find their classes, and a new
file in the package is a new family."""

import importlib
import pickle
import sys
import textwrap

import pytest

import guides
import guides.families
from guides.families import MOVED, alias_old_paths


@pytest.mark.parametrize("name", MOVED)
def test_an_old_module_path_is_the_moved_module(name):
    old = importlib.import_module(f"guides.{name}")
    new = importlib.import_module(f"guides.families.{name}")
    assert old is new and getattr(guides, name) is new


def test_a_pickle_naming_an_old_path_loads_the_moved_class():
    cls = guides.AutoTridiagonal
    assert cls.__module__ == "guides.families.tridiagonal"
    new = pickle.dumps(cls, protocol=0)  # text: the module path as written
    old = new.replace(b"guides.families.tridiagonal", b"guides.tridiagonal")
    assert b"guides.tridiagonal" in old and pickle.loads(old) is cls


def test_every_family_lives_in_the_package_and_the_registry_knows_it():
    for name, cls in guides.registry.families().items():
        assert cls.__module__.startswith("guides.families."), (name, cls.__module__)


def test_a_new_file_in_the_package_is_a_new_family(tmp_path, monkeypatch):
    (tmp_path / "demo_family.py").write_text(
        textwrap.dedent("""
        from guides.base import PerSiteGuide
        from guides.site import DiagonalSite


        class AutoDemoFamily(PerSiteGuide, family="demo_family"):
            site_class = DiagonalSite
        """)
    )
    monkeypatch.setattr(guides.families, "__path__", [*guides.families.__path__, str(tmp_path)])
    try:
        assert "guides.families.demo_family" in guides.families.import_all()
        assert "demo_family" in guides.available()
    finally:
        guides.registry.unregister("demo_family")
        sys.modules.pop("guides.families.demo_family", None)
    alias_old_paths(guides)  # a second call changes nothing
    assert guides.tridiagonal is sys.modules["guides.families.tridiagonal"]
