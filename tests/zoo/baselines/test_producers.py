"""A new baseline is one file in ``zoo/baselines/``: its posterior kind (a class statement) and
its producer (``producers.register``), with nothing else to edit. The test writes such a file,
imports the package's modules as ``import zoo`` does, and uses the baseline everywhere a
baseline is named: a ``compare`` row, the command line's ``--guides``, ``zoo.load``."""

import sys
import textwrap

import pytest
import torch

import zoo
import zoo.baselines
from zoo.baselines import producers
from zoo.cli import build_parser
from zoo.cli.parser import baselines
from zoo.results import contract
from zoo.runtime.modules import import_all

NEW_BASELINE = '''
"""Draws of one diagonal fit, as a baseline of its own (a stand-in for SWAG)."""

import zoo
from zoo.baselines import producers
from zoo.results.draws import Draws, draws_from_payload


class DemoDraws(Draws, kind="demo_draws"):
    @classmethod
    def read(cls, payload, path, model, map_location):
        d = draws_from_payload(payload, path, model, map_location)
        return cls(d.model, d.draws, d.options, d.wall_time, d.device)


def _check(options):
    if set(options) - {"draws"}:
        raise ValueError(f"it takes the option 'draws', got {sorted(options)}")


def _make(model_factory, family, options, train, args, progress):
    fit = zoo.fit(model_factory(), "diagonal", train, **args)
    draws = fit.sample(options.get("draws", 4))
    return DemoDraws(fit.model, {k: v.unsqueeze(0) for k, v in draws.items()}, {"label": "demo"})


producers.register("demo_draws", _check, _make)
'''


@pytest.fixture
def new_baseline(tmp_path, monkeypatch):
    (tmp_path / "demo_draws.py").write_text(textwrap.dedent(NEW_BASELINE))
    monkeypatch.setattr(zoo.baselines, "__path__", [*zoo.baselines.__path__, str(tmp_path)])
    names = [m.__name__ for m in import_all(zoo.baselines)]
    yield names
    producers.unregister("demo_draws")
    contract.KINDS.pop("demo_draws")
    sys.modules.pop("zoo.baselines.demo_draws")


def test_a_new_baseline_is_one_file(new_baseline, tmp_path):
    assert "zoo.baselines.demo_draws" in new_baseline
    assert "demo_draws" in baselines()
    args = build_parser().parse_args(["compare", "--guides", "map", "demo_draws"])
    assert args.guides == ["map", "demo_draws"]

    x, y = torch.randn(40, 3), torch.randint(0, 3, (40,))

    def factory():
        return zoo.models.BayesianMLP(3, (4,), 3, task="classification")

    rows = ["map", ("demo", "demo_draws", {"draws": 3})]
    table, fits = zoo.compare(factory, rows, (x, y), (x, y), num_samples=2, num_steps=2,
                              progress=False, return_fits=True)  # fmt: skip
    assert "demo" in table.to_string()
    made = fits["demo"]
    assert type(made).__name__ == "DemoDraws" and made.shape == (1, 3)
    path = tmp_path / "demo.pt"
    made.save(path)
    loaded = zoo.load(path)
    assert type(loaded) is type(made) and loaded.shape == (1, 3)
    with pytest.raises(ValueError, match="takes the option 'draws'"):
        zoo.compare(factory, [("bad", "demo_draws", {"members": 2})], (x, y), (x, y),
                    num_steps=1)  # fmt: skip


def test_a_producer_name_is_taken_once_and_is_an_identifier():
    with pytest.raises(ValueError, match="registered already"):
        producers.register("ensemble", lambda o: None, lambda *a: None)
    with pytest.raises(ValueError, match="an identifier"):
        producers.register("not a name", lambda o: None, lambda *a: None)
    with pytest.raises(KeyError):
        producers.unregister("never_registered")
    assert {"laplace", "ensemble"} <= set(producers.PRODUCERS)
