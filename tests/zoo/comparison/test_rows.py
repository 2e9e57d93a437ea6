"""The rows of zoo.compare (zoo.comparison.rows): every form of an entry read as one Row, the
producers keyed by kind, each row checked before any fit."""

import pytest
import torch

import zoo
from zoo.comparison import PRODUCERS, Row, rows_of


def test_every_form_of_an_entry_is_one_row():
    fit = zoo.fit(zoo.models.BayesianMLP(2, (3,), 1, noise=1.0),
                  "diagonal", (torch.randn(16, 2), torch.randn(16)), num_steps=2,
                  run=zoo.Run(progress=False))  # fmt: skip
    assert Row.of("diagonal") == Row("diagonal", "diagonal")
    assert Row.of(("r2", "lowrank", {"rank": 2})) == Row("r2", "lowrank", {"rank": 2})
    own = Row.of(("local", "diagonal", {}, {"estimator": "local"}))
    assert own.fit_options == {"estimator": "local"} and own.posterior is None
    given = Row.of(("mine", fit))
    assert given.family is None and given.posterior is fit
    assert given.produce(None, None, {}, False) is fit  # nothing is fitted
    rows = rows_of({"a": "diagonal", "b": fit})
    assert [r.label for r in rows] == ["a", "b"]
    with pytest.raises(ValueError, match="each entry of guides is"):
        Row.of(3)
    with pytest.raises(ValueError, match="unique"):
        rows_of(["diagonal", "diagonal"])
    with pytest.raises(ValueError, match="empty"):
        rows_of([])


def test_the_producers_are_keyed_by_kind_and_check_before_any_fit():
    assert set(PRODUCERS) == {"laplace", "ensemble"}
    with pytest.raises(ValueError, match="the ensemble row 'e'.*takes the options"):
        Row("e", "ensemble", {"membres": 3}).check()
    with pytest.raises(ValueError, match="the laplace row 'l'.*'at' is 'module'"):
        Row("l", "laplace", {"at": "map"}).check()
    Row("l", "laplace", {"hessian": "diag"}).check()
