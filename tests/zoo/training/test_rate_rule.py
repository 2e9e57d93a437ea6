"""zoo.training.rate_rule: how a learning-rate sweep's data terms give a rate."""

import itertools
import math

import pytest
import torch

from zoo.training.rate_rule import (
    DIVISOR,
    STEEP_FACTOR,
    VALLEY_FACTOR,
    choose,
    landmarks,
    smoothed,
    valley,
)


def test_smoothing_is_a_bias_corrected_moving_average():
    assert smoothed([5.0, 5.0, 5.0]) == pytest.approx([5.0, 5.0, 5.0])
    beta, values = 0.8, [1.0, 3.0]
    second = (beta * (1 - beta) * 1.0 + (1 - beta) * 3.0) / (1 - beta**2)
    assert smoothed(values, beta) == pytest.approx([1.0, second])


def test_the_rate_is_the_smoothed_minimum_divided():
    rates = [10 ** (k / 4) for k in range(-8, 9)]  # 1e-2 .. 1e2
    # a minimum at 1 (index 8): noise at low rates, a fall from the fifth rate, then a steep
    # climb; the fall is short, so its valley is within sixteen times the minimum's rate
    losses = [100.0 + 2 * min(i, 4) - 20 * max(i - 4, 0) + 200 * max(i - 8, 0) ** 2
              for i in range(17)]  # fmt: skip
    lr_min, lr = choose(rates, losses)
    smooth = smoothed(losses)
    assert lr_min == rates[smooth.index(min(smooth))]
    assert lr == pytest.approx(lr_min / DIVISOR)


def test_a_loss_still_falling_at_the_top_takes_the_valleys_multiple():
    """The minimum is the sweep's last rate, which says only that the fit can take more: the
    rate is read inside the fall (its valley), not a quarter of the top."""
    rates = [10 ** (k / 4) for k in range(-8, 9)]
    losses = [100.0 - i for i in range(17)]
    marks = landmarks(losses)
    assert marks.valley == 6  # the run is all 17 steps: -1 + int(17 / 3) + int(17 / 6)
    lr_min, lr = choose(rates, losses)
    assert lr_min == rates[-1] and lr == pytest.approx(rates[6] * VALLEY_FACTOR)
    assert lr < rates[-1] / DIVISOR


def _longest_fall(values):
    """The length of the longest strictly falling subsequence of ``values`` and the earliest
    last index of one that long, by enumerating every subsequence."""
    for size in range(len(values), 0, -1):
        ends = [picked[-1] for picked in itertools.combinations(range(len(values)), size)
                if all(values[a] > values[b] for a, b in itertools.pairwise(picked))]  # fmt: skip
        if ends:
            return size, min(ends)
    raise AssertionError("no subsequence")


@pytest.mark.parametrize("seed", range(6))
def test_the_valley_is_halfway_along_the_longest_falling_run(seed):
    g = torch.Generator().manual_seed(seed)
    values = (torch.randn(11, generator=g) - 0.3 * torch.arange(11)).tolist()
    size, last = _longest_fall(values)
    start = last - size  # fastai's: the run's length back from its end
    third = (last - start) / 3
    assert valley(values) == max(start + int(third) + int(third / 2), 0)


def test_a_valley_far_before_the_minimum_caps_the_rate():
    """Batch norm's sweep: a fall in the middle, then a long slow slide to the sweep's end,
    where the minimum sits: the minimum over four would be far past the fall, the valley's
    four times is the rate."""
    rates = [10 ** (k / 8) for k in range(-16, 17)]  # 1e-2 .. 1e2, 33 steps
    losses = [100.0 - 0.05 * i - 50 / (1 + math.exp(-(i - 12) / 1.5)) for i in range(33)]
    marks = landmarks(losses)
    lr_min, lr = choose(rates, losses)
    assert marks.best == 32 and lr_min == rates[-1]
    expected = rates[marks.valley] * VALLEY_FACTOR
    assert expected < min(rates[-1] / DIVISOR, rates[marks.steep] * STEEP_FACTOR)
    assert lr == pytest.approx(expected)


def test_a_sweep_that_never_falls_reads_no_rate():
    rates = [10 ** (k / 4) for k in range(-8, 9)]
    assert choose(rates, [100.0 + i for i in range(17)]) == (rates[0], None)


def test_a_sweep_that_diverges_at_once_takes_its_lowest_rate():
    rates = [0.1, 0.2, 0.4, 0.8]
    lr_min, lr = choose(rates, [1.0, math.inf])
    assert lr_min == 0.1 and lr == pytest.approx(0.1 / DIVISOR)


def test_the_valley_never_moves_back():
    """Each new longest falling run ends later than the last and is one step longer, so its
    valley never moves to an earlier step: checked on noisy walks with many dips."""
    gen = torch.Generator().manual_seed(1)
    for _ in range(200):
        n = int(torch.randint(3, 30, (1,), generator=gen))
        values = (torch.randn(n, generator=gen) * 10).cumsum(0).tolist()
        at = [valley(values[:k]) for k in range(1, n + 1)]
        assert at == sorted(at)
