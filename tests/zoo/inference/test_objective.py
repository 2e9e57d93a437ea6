"""zoo.Objective.loss_with_data_term: the data term read from the loss's own evaluation equals
the loss less its KL part evaluated separately on the same draws, for every family of the
registry, eager and compiled, under a KL weight other than one."""

import pytest
import torch

import guides
import zoo
from tests.families import PRIMARY
from zoo.models import BayesianMLP
from zoo.storage import files


def data(n=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, generator=g), torch.randint(0, 2, (n,), generator=g)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("label", list(PRIMARY))
def test_the_data_term_is_the_loss_less_its_kl_on_the_same_draw(label, jit):
    family, options = PRIMARY[label]
    torch.manual_seed(0)
    model = BayesianMLP(3, (5,), 2, task="classification")
    guide = guides.get(family)(model, **options)
    x, y = data()
    objective = zoo.Objective(model, guide, kl_weight=0.5, jit=jit)
    objective.setup(x[:8], y[:8])
    xb, yb = x[:8], y[:8]
    objective.loss(xb, yb, num_data=96)  # a compiled loss builds (and checks) its graph here
    before = files.torch_rng_state()
    expected_loss = objective.loss(xb, yb, num_data=96).detach()
    files.set_torch_rng_state(before)  # the same draw, the likelihood scaled to zero
    expected = expected_loss - 0.5 * objective.kl(xb, yb)
    files.set_torch_rng_state(before)
    loss, leaf = objective.loss_with_data_term(xb, yb, num_data=96)
    assert leaf.requires_grad and leaf.item() == 12.0 and leaf.grad is None
    (0.25 * loss).backward()  # a step's factor (its share, per_example's 1 / N) on the loss
    torch.testing.assert_close(loss.detach(), expected_loss)
    torch.testing.assert_close(leaf.detach() * leaf.grad / 0.25, expected, rtol=1e-5, atol=1e-4)
    if jit and objective.jit_state != "compiled":
        pytest.fail(f"the compiled objective ran {objective.jit_state}")
