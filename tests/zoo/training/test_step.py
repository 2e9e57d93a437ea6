"""The step engine (zoo.training.step): gradient accumulation, the ELBO scaling of a step of several
minibatches, and a hand-written loop on the engine without zoo.fit."""

import math

import pytest
import torch

import zoo
from zoo.inference.objective import Objective
from zoo.models import BayesianMLP
from zoo.training.step import Stepper


def regression(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g)
    return x, x.sum(1) + 0.1 * torch.randn(n, generator=g)


def map_fit(batch_size, accumulate, jit=False, **options):
    """The point mass: a deterministic loss (no draws), so equal gradients mean equal fits."""
    torch.manual_seed(0)
    model = BayesianMLP(3, (8,), 1, noise=1.0)
    return zoo.fit(
        model,
        "map",
        regression(),
        num_steps=12,
        batch_size=batch_size,
        lr=0.01,
        engine=zoo.Engine(accumulate=accumulate, jit=jit),
        run=zoo.Run(progress=False),
        **options,
    )


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "compiled"])
def test_two_minibatches_of_b_per_step_equal_one_minibatch_of_2b(jit):
    """The shuffle cuts the same permutation into batches of B or 2B, so minibatches (2i, 2i+1)
    of B are minibatch i of 2B: the fits take the same steps, up to float summation order."""
    two = map_fit(batch_size=8, accumulate=2, jit=jit)
    one = map_fit(batch_size=16, accumulate=1, jit=jit)
    assert two.options["accumulate"] == 2 and two.steps == one.steps == 12
    assert two.losses == pytest.approx(one.losses, rel=1e-5)
    for (name, a), b in zip(two.guide.state_dict().items(), one.guide.state_dict().values()):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), name


def test_an_epoch_counts_optimiser_steps():
    """64 examples at B = 8 are 8 minibatches: 4 steps of 2, 3 steps of 3 (the last has 2)."""
    x, y = regression()
    model = BayesianMLP(3, (8,), 1, noise=1.0)
    for k, steps in [(2, 4), (3, 3)]:
        fit = zoo.fit(
            model,
            "diagonal",
            (x, y),
            epochs=2,
            batch_size=8,
            engine=zoo.Engine(accumulate=k),
            run=zoo.Run(progress=False),
        )
        assert fit.steps == 2 * steps and len(fit.epoch_losses) == 2


def test_a_step_of_minibatches_of_unequal_sizes_weighs_them_by_size():
    """The step's loss is sum_i (B_i / sum B) L_i with L_i scaled by N / B_i: the likelihood of
    every example counts N / sum(B) times, as in one minibatch of all of them."""
    x, y = regression(20)
    model = BayesianMLP(3, (4,), 1, noise=1.0)
    guide = zoo.fit(model, "map", (x, y), num_steps=1, run=zoo.Run(progress=False)).guide
    objective = Objective(model, guide, jit=False)
    objective.setup(x[:2], y[:2])
    params = [p for p in guide.parameters()]
    for p in params:
        p.grad = None  # the fit left its last step's
    whole = objective.loss(x[:12], y[:12], 20)
    whole.backward()
    expected = [p.grad.clone() for p in params]
    opt = torch.optim.SGD(params, lr=0.0)
    engine = Stepper.build(objective, opt, num_data=20)
    opt.zero_grad()
    parts = [(x[:9], y[:9]), (x[9:12], y[9:12])]
    loss = engine.body(parts, lambda a, b: objective.loss(a, b, 20))[0]
    assert float(loss) == pytest.approx(float(whole.detach()), rel=1e-6)
    for g, p in zip(expected, params):
        assert torch.allclose(p.grad, g, rtol=1e-5, atol=1e-6)


def test_a_hand_written_loop_on_the_engine_reads_every_k_steps_and_guards():
    """The module's example: fused Adam on the CPU skips on the device, the host reads every
    5 steps, the history holds every step; a non-finite step raises with the guide restored."""
    x, y = regression()
    model = BayesianMLP(3, (8,), 1, noise=1.0)
    guide = zoo.fit(model, "diagonal", (x, y), num_steps=1, run=zoo.Run(progress=False)).guide
    objective = Objective(model, guide)
    objective.setup(x[:2], y[:2])
    opt = torch.optim.Adam(list(guide.parameters()), lr=1e-3, fused=True)
    engine = Stepper.build(objective, opt, num_data=len(x), check_every=5)
    reads = 0
    for start in range(0, 64, 8):
        engine.step([(x[start : start + 8], y[start : start + 8])])
        if engine.due:
            assert math.isfinite(engine.settle())
            reads += 1
    engine.settle()
    assert reads == 1 and len(engine.state.losses) == 8 and engine.state.step == 8
    bad = x.clone()
    bad[0, 0] = float("nan")
    engine.step([(bad[:8], y[:8])])
    with pytest.raises(zoo.FitDivergedError, match="diverged at step 8") as err:
        engine.settle()
    assert "back at the parameters of step 5" in str(err.value)  # the copy read at step 5
    assert all(torch.isfinite(v).all() for v in guide.state_dict().values())


def test_the_engine_takes_its_refusals_from_the_step_rules():
    """A hand-written loop asking for reads every k steps with an optimiser that cannot skip on
    the device is refused with the table's reason, before any step."""
    x, y = regression(16)
    model = BayesianMLP(3, (4,), 1, noise=1.0)
    guide = zoo.fit(model, "diagonal", (x, y), num_steps=1, run=zoo.Run(progress=False)).guide
    objective = Objective(model, guide)
    objective.setup(x[:2], y[:2])
    opt = torch.optim.RMSprop(list(guide.parameters()), lr=1e-3)
    with pytest.raises(ValueError, match="skips a non-finite update on the device"):
        Stepper.build(objective, opt, num_data=16, check_every=5)
    assert Stepper.build(objective, opt, num_data=16).plan.check_every == 1
