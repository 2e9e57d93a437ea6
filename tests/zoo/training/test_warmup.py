"""zoo.training.warmup: the states a learning-rate sweep holds for its fit to go on from."""

import torch

from zoo.training import warmup as warmup_states
from zoo.training.rate_rule import choose, reached
from zoo.training.warmup import Snapshot, Warmup


def test_the_chosen_rate_of_a_prefix_never_falls():
    """A random check of what the warm-up relies on: the rate a sweep's prefix chooses never
    falls as the sweep goes on (the valley included), on random walks that fall, then climb."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(300):
        n = int(torch.randint(3, 40, (1,), generator=gen))
        rates = [0.1 * 1.3**i for i in range(n)]
        turn = float(torch.rand(1, generator=gen)) * 2 * n
        steps = torch.randn(n, generator=gen) * 4 + torch.tensor(
            [-2.0 if i < turn else 3.0 for i in range(n)]
        )
        losses = (100 + steps.cumsum(0)).tolist()
        chosen = [choose(rates[:k], losses[:k])[1] for k in range(3, n + 1)]
        read = [c for c in chosen if c is not None]
        assert read == sorted(read)


def test_the_held_states_are_those_the_choice_may_still_reach():
    """Of the states below the prefix's choice only the latest is held: a long sweep still
    falling holds about half of its states (the valley trails the sweep), not all, and puts
    back the chosen one."""
    t = torch.zeros(3)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    warmup = Warmup([t], opt)
    rates = [0.01 * 1.5**i for i in range(40)]
    losses = [100.0 - i for i in range(40)]  # still falling: the choice follows the sweep
    for i in range(40):
        t.fill_(i + 1)
        floor = reached(rates[: i + 1], choose(rates[: i + 1], losses[: i + 1])[1])
        warmup.offer(i + 1, floor)
        assert min(warmup.held) == floor and len(warmup.held) <= (i + 1) // 2 + 4
    assert 0 not in warmup.held  # the start is below the choice: dropped
    _, lr = choose(rates, losses)
    k = sum(r <= lr * (1 + 1e-9) for r in rates)
    assert warmup.put_back(k) == k and torch.equal(t, torch.full((3,), float(k)))


def test_past_its_memory_the_sweep_puts_back_the_latest_state_it_holds(monkeypatch):
    t = torch.zeros(256)  # 1 KiB a state
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    monkeypatch.setattr(warmup_states, "WARMUP_MEMORY", 3 * 1024)
    warmup = Warmup([t], opt)
    rates = [0.01 * 1.5**i for i in range(10)]
    for i in range(10):
        t.fill_(i + 1)
        warmup.offer(i + 1, reached(rates[: i + 1], None))  # no rate read: all kept
    assert sorted(warmup.held) == [0, 1, 2, 3]
    assert warmup.put_back(7) == 3 and torch.equal(t, torch.full((256,), 3.0))


def test_the_memory_bound_counts_the_optimisers_moments(monkeypatch):
    """A state after an Adam step holds the parameter and its two moments: three times the
    parameter's bytes (and the step count), each counted against the bound."""
    p = torch.nn.Parameter(torch.zeros(256))  # 1 KiB
    opt = torch.optim.Adam([p], lr=0.1)
    p.grad = torch.ones(256)
    opt.step()
    assert Snapshot([p], opt).nbytes >= 3 * 1024
    monkeypatch.setattr(warmup_states, "WARMUP_MEMORY", 7 * 1024)
    warmup = Warmup([p], opt)
    for i in range(5):
        opt.step()
        warmup.offer(i + 1, 0)
    assert sorted(warmup.held) == [0, 1, 2]  # two states of 3 KiB and more fit in 7 KiB
