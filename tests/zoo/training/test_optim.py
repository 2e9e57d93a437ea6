"""The optimiser of a fit: named parameter groups, one place that sets the rate, and the
(mean, scale) pairs an optimiser may take (:mod:`guides.pairs`), checked by a toy natural-gradient
optimiser that reaches the mean-field optimum of a conjugate model in closed form."""

import pytest
import torch

import guides
import zoo
from guides.site import direct_parameters
from tests.zoo.linear_gaussian import correlated_data, exact_posterior, model_for
from zoo.training.optim import make_optimizer, param_groups, set_rate, takes_pairs, write_rate


class ToyNaturalGradient(torch.optim.Optimizer):
    """The Bayesian learning rule for a diagonal Gaussian ``q = N(m, diag(s^2))`` read through
    the pairs: the loss ``L = -ELBO`` has ``dL/ds = s E[-f''] - 1/s`` (``f`` the log joint), so
    ``h = (dL/ds + 1/s) / s`` estimates the precision ``E[-f'']``; each step takes
    ``S <- (1 - lr) S + lr h``, ``m <- m - lr dL/dm / S`` and writes ``s = S^(-1/2)``."""

    def __init__(self, params, lr, pairs):
        super().__init__(params, {"lr": lr})
        self.pairs = [p for p in pairs if p.raw_scale is not None]
        if not self.pairs:
            raise ValueError("ToyNaturalGradient needs a family with per-weight scales")
        self.precision = [pair.std().pow(-2) for pair in self.pairs]

    @torch.no_grad()
    def step(self, closure=None):
        lr = self.param_groups[0]["lr"]
        for k, pair in enumerate(self.pairs):
            s, grad_s, grad_m = pair.std(), pair.std_grad(), pair.mean.grad
            if grad_s is None or grad_m is None:
                continue
            h = (grad_s + 1 / s) / s
            self.precision[k] = ((1 - lr) * self.precision[k] + lr * h).clamp_min(1e-6)
            pair.mean.sub_(lr * grad_m / self.precision[k])
            pair.set_std(self.precision[k].rsqrt())


def test_a_natural_gradient_optimiser_reaches_the_mean_field_optimum_through_the_pairs():
    """On Bayesian linear regression (correlated inputs) the diagonal family's optimum is known
    in closed form: the exact posterior mean, and each weight's variance ``1 / Lambda_ii`` (the
    inverse of the exact precision's diagonal)."""
    x, y = correlated_data(n=200, d=3)
    torch.manual_seed(0)
    fit = zoo.fit(
        model_for(3), "diagonal", (x, y), num_steps=400, batch_size=len(x), lr=0.2,
        optim=zoo.Optim(optimizer=ToyNaturalGradient),
        loss=zoo.Loss(num_particles=64, map_start=False), run=zoo.Run(progress=False),
    )  # fmt: skip
    mean, precision = exact_posterior(x, y)
    std = precision.diagonal().rsqrt()
    pairs = {p.site: p for p in guides.mean_scale_pairs(fit.guide)}
    assert set(pairs) == {"fc1.weight", "fc1.bias"}
    got_mean = torch.cat([pairs["fc1.weight"].mean.reshape(-1), pairs["fc1.bias"].mean])
    got_std = torch.cat([pairs["fc1.weight"].std().reshape(-1), pairs["fc1.bias"].std()])
    assert torch.allclose(got_mean.detach(), mean, atol=0.2 * float(std.min()))
    assert torch.allclose(got_std, std, rtol=0.1)
    # not the exact posterior's marginals, which correlated inputs make 1.7-2.2 times wider
    marginal = torch.linalg.inv(precision).diagonal().sqrt()
    assert (marginal[:3] > 1.5 * got_std[:3]).all()


def test_the_pairs_reach_only_an_optimiser_that_asks_for_them():
    seen = {}

    class Asks(torch.optim.SGD):
        def __init__(self, params, lr, pairs):
            seen["pairs"] = pairs
            super().__init__(params, lr=lr)

    x, y = correlated_data(n=64, d=2)
    zoo.fit(model_for(2), "diagonal", (x, y), num_steps=2, lr=0.01,
            optim=zoo.Optim(optimizer=Asks), run=zoo.Run(progress=False))  # fmt: skip
    assert [p.site for p in seen["pairs"]] == ["fc1.weight", "fc1.bias"]
    assert takes_pairs(Asks) and not takes_pairs(torch.optim.Adam)
    with pytest.raises(ValueError, match="may not hold 'pairs'"):
        zoo.fit(model_for(2), "diagonal", (x, y), num_steps=2, lr=0.01,
                optim=zoo.Optim(optimizer=Asks, optimizer_options={"pairs": []}),
                run=zoo.Run(progress=False))  # fmt: skip


def _guide(family="diagonal"):
    model = model_for(2)
    guide = guides.get(family)(model)
    x, y = correlated_data(n=8, d=2)
    with direct_parameters():  # Pyro's global store untouched
        guide(x, y)
    return model, guide


def test_groups_keep_the_parameter_names_and_their_factor():
    model, guide = _guide()
    groups = param_groups(guide, model, 0.1, {"*rho*": 0.5})
    opt = make_optimizer(torch.optim.Adam, groups, 0.1, {})
    names = {n for g in opt.param_groups for n in g["param_names"]}
    assert names == {n for n, _ in guide.named_parameters()}
    by_factor = {g["lr_factor"]: g for g in opt.param_groups}
    assert all("rho" in n for n in by_factor[0.5]["param_names"])
    assert by_factor[0.5]["lr"] == pytest.approx(0.05)
    set_rate(opt, 0.02)
    assert by_factor[0.5]["lr"] == pytest.approx(0.01) and by_factor[1.0]["lr"] == 0.02
    state = opt.state_dict()  # an optimiser state saved before groups kept names and factors
    for g in state["param_groups"]:
        del g["param_names"], g["lr_factor"]
    opt.load_state_dict(state)
    set_rate(opt, 0.3)
    assert [g["lr"] for g in opt.param_groups] == [0.3, 0.3]


def test_a_tensor_rate_is_filled_in_place():
    group = {"lr": torch.tensor(0.1)}
    held = group["lr"]
    write_rate(group, 0.25)
    assert group["lr"] is held and float(held) == 0.25


def test_one_place_sets_a_rate():
    """Outside ``zoo/training/optim.py`` no module writes a group's ``lr`` (the CUDA graph only
    turns it into a tensor once, which ``write_rate`` then fills)."""
    import pathlib
    import re

    root = pathlib.Path(zoo.__file__).parent
    writes = {
        str(path.relative_to(root))
        for path in root.rglob("*.py")
        if re.search(r"\[[\"']lr[\"']\]\s*=[^=]", path.read_text())
    }
    assert writes <= {"training/optim.py", "training/cuda_graph.py"}, writes
