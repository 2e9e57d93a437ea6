"""``zoo.subnetwork_guide``: Daxberger et al.'s choice of weights (the largest marginal variances
of a diagonal Laplace at the MAP, laplace-torch's own mask on the same network), the guide it
returns (masks, means at the MAP, a fit that moves only the chosen weights), and what is
refused before any work. Skipped without laplace-torch."""

import pytest
import torch

import guides
import zoo
from tests.zoo.baselines.test_laplace_fitting import classification, classifier
from zoo.results import laplace_torch

laplace = pytest.importorskip("laplace", exc_type=ImportError)


@pytest.fixture(scope="module")
def map_fit():
    x, y = classification()
    fit = zoo.fit(classifier(), "map", (x, y), num_steps=100, seed=0, run=zoo.Run(progress=False))
    return fit, x, y


def test_the_guide_holds_the_largest_variance_weights_of_laplace_torchs_mask(map_fit):
    """The chosen weights are the positions of laplace-torch's
    ``LargestVarianceDiagLaplaceSubnetMask`` on the MAP network (same prior precision), as
    site masks; every mean starts at the MAP; a fit moves only the chosen weights' spread."""
    from laplace.utils import LargestVarianceDiagLaplaceSubnetMask

    fit, x, y = map_fit
    guide = zoo.subnetwork_guide(fit.model, (x, y), 10, at=fit, prior_precision=2.0)
    weights = {k: v.detach() for k, v in fit.guide.median().items()}
    net = laplace_torch.network_at(fit.model, weights)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=128)
    diag = laplace.Laplace(net, "classification", "all", "diag", prior_precision=2.0)
    want = LargestVarianceDiagLaplaceSubnetMask(net, 10, diag).get_subnet_mask(loader)
    names = list(fit.model.site_shapes)
    got = torch.cat(
        [
            torch.zeros(fit.model.site_shapes[n].numel(), dtype=torch.bool).index_fill_(
                0, guide.masks.get(n, torch.zeros(0, dtype=torch.long)), True
            )
            for n in names
        ]
    )
    assert torch.equal(got, want) and guide.size == 10
    assert isinstance(guide, guides.AutoSubnetwork)

    after = zoo.fit(fit.model, guide, (x, y), num_steps=5, seed=0, run=zoo.Run(progress=False))
    draws = after.sample(20, seed=0)
    flat = torch.cat([draws[n].reshape(20, -1) for n in names], 1)
    assert torch.equal(flat.std(0) > 0, want)  # the unchosen weights are point masses
    fresh = zoo.subnetwork_guide(fit.model, (x, y), 10, at=fit, prior_precision=2.0)
    fresh(x, y)  # set up: the means are the MAP's
    for n in names:
        torch.testing.assert_close(fresh.site_posterior(n).loc.detach(), weights[n])


def test_it_makes_its_own_map_fit_and_defaults_to_every_weight_of_a_small_model():
    x, y = classification()
    guide = zoo.subnetwork_guide(classifier(), (x, y), num_steps=20, progress=False)
    assert guide.size == 3 * 16 + 16 + 16 * 2 + 2  # 98 weights, under the default 256


def test_what_cannot_run_is_refused_before_any_work(map_fit):
    fit, x, y = map_fit
    with pytest.raises(ValueError, match="size=500 is more than the model's 98 network weights"):
        zoo.subnetwork_guide(fit.model, (x, y), 500, at=fit)
    with pytest.raises(ValueError, match="size must be an int"):
        zoo.subnetwork_guide(fit.model, (x, y), 2.5, at=fit)
    with pytest.raises(TypeError, match="at must be None or a FitResult"):
        zoo.subnetwork_guide(fit.model, (x, y), 10, at="module")
    with pytest.raises(ValueError, match="rank"):
        zoo.subnetwork_guide(fit.model, (x, y), 10, at=fit, rank=0)
    with pytest.raises(TypeError, match="pass jit= in engine"):
        zoo.subnetwork_guide(fit.model, (x, y), 10, jit=False)
