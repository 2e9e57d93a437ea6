"""An ensemble's members share one rate (zoo.baselines.ensembles.shared_rate): the first
member's range test chooses it and the others run their whole budget at it, to the bit the
fits ``zoo.fit`` makes given that rate and schedule; in processes and after a resume alike; a
given rate or schedule is the caller's."""

import multiprocessing

import pytest
import torch

import guides
import zoo
from zoo.results.ensembles import SHARED_RATE

QUIET = zoo.Run(progress=False)
STEPS = 80  # long enough for the range test (zoo.training.rate.MIN_FIT_STEPS)
HOW = {"num_steps": STEPS, "batch_size": 32}


def data(n=256):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 3, generator=g)
    return x, (x[:, 0] + 0.5 * x[:, 1] > 0).long()


def classifier():
    return zoo.models.BayesianMLP(3, (8,), 2, task="classification")


def same(a, b) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.guide.parameters(), b.guide.parameters()))


def test_the_first_members_range_test_gives_every_member_its_rate():
    ens = zoo.ensemble(classifier, data(), members=3, progress=False, **HOW)
    first, *rest = ens.members
    test = first.options["lr_test"]
    assert first.options["lr_rule"] == "range test" and first.steps == STEPS - test["steps"]
    member = guides.family("map", init_loc_fn="kaiming")  # each member's own draw
    for k, fitted in enumerate(rest, start=1):
        assert "lr_test" not in fitted.options and fitted.options["lr_rule"] == "given"
        assert fitted.options["lr"] == test["lr"] and fitted.steps == STEPS
        alone = zoo.fit(classifier(), member, data(), seed=k, lr=test["lr"], run=QUIET,
                        optim=zoo.Optim(lr_schedule="exponential"), **HOW)  # fmt: skip
        assert same(fitted, alone)  # the whole budget at the chosen rate, decaying tenfold
    assert ens.options["rate"] == SHARED_RATE
    fitting = ens.fitting()
    assert fitting["lr"] == pytest.approx(test["lr"]) and fitting["steps"] == 3 * STEPS
    rule = f"range test ({test['steps']} steps) of the first member, given to the other 2"
    assert fitting["lr_rule"] == rule


@pytest.mark.slow  # runs child processes: the full tier
def test_members_in_processes_and_a_resumed_ensemble_share_the_same_rate(tmp_path):
    here = zoo.ensemble(classifier, data(), members=3, progress=False, **HOW)
    there = zoo.ensemble(classifier, data(), members=3, progress=False, processes=2, **HOW)
    assert all(same(a, b) for a, b in zip(here.members, there.members))
    assert there.options["rate"] == SHARED_RATE and multiprocessing.active_children() == []
    path = tmp_path / "ck.pt"
    zoo.ensemble(classifier, data(), members=3, run=zoo.Run(progress=False, checkpoint=path),
                 **HOW)  # fmt: skip
    (tmp_path / "ck.member2.pt").unlink()  # as if stopped during member 2
    again = zoo.ensemble(classifier, data(), members=3, **HOW,
                         run=zoo.Run(progress=False, checkpoint=path, resume=path))  # fmt: skip
    assert all(same(a, b) for a, b in zip(here.members, again.members))
    assert again.members[2].options["lr"] == here.members[0].options["lr_test"]["lr"]


def test_a_given_rate_or_schedule_is_the_callers():
    given = zoo.ensemble(classifier, data(), members=2, progress=False, lr=0.01, **HOW)
    assert "rate" not in given.options
    assert [m.options["lr_rule"] for m in given.members] == ["given", "given"]
    assert given.fitting()["lr_rule"] == "given (each of 2 members)"
    cosine = zoo.ensemble(classifier, data(), members=2, progress=False,
                          optim=zoo.Optim(lr_schedule="cosine"), **HOW)  # fmt: skip
    first, second = cosine.members
    assert second.options["lr"] == first.options["lr_test"]["lr"]
    assert first.options["lr_schedule"] == second.options["lr_schedule"] == "cosine"
    one = zoo.ensemble(classifier, data(), members=1, progress=False, **HOW)
    assert "rate" not in one.options and "lr_test" in one.members[0].options
