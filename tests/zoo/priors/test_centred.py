"""zoo.priors.CentredNormalPrior: MOPED's empirical Bayes around a trained network."""

import pytest
import torch
from torch import nn

import guides
import zoo
from tests.trained import trained_cnn
from zoo.models import from_module

QUIET = zoo.Run(progress=False)


class Bare(nn.Module):
    def __init__(self):
        super().__init__()
        self.out = nn.Linear(16, 10)

    def forward(self, x):
        return self.out(x)


@pytest.fixture
def trained():
    return trained_cnn()


def test_a_centred_prior_is_moped_around_the_trained_weights(trained):
    from torch.distributions import kl_divergence

    from zoo.priors import CentredNormalPrior

    net, (x, y), _ = trained
    model = from_module(net, prior=CentredNormalPrior(net, delta=0.1), init="module")
    params = model.net_means()
    site = model.prior.site_distribution("5.weight", model.site_shapes["5.weight"], 128, {})
    torch.testing.assert_close(site.mean, params["5.weight"])
    expected = (0.1 * params["5.weight"].abs()).clamp_min(1e-4)
    torch.testing.assert_close(site.stddev, expected)
    guide = guides.AutoDiagonal(model)
    with zoo.models.frozen_statistics():
        guide(x[:4], y[:4])
    q = guide.get_posterior("5.weight")
    dense_q = torch.distributions.Normal(q.mean, q.variance.sqrt())
    dense_p = torch.distributions.Normal(site.mean, site.stddev)
    torch.testing.assert_close(kl_divergence(q, site), kl_divergence(dense_q, dense_p).sum())
    fit = zoo.fit(model, "diagonal", (x, y), num_steps=3, loss=zoo.Loss(elbo="meanfield"),
                  run=QUIET)  # fmt: skip
    assert fit.losses[-1] == fit.losses[-1]  # finite, closed-form KL
    with pytest.raises(ValueError, match="needs a centre of each site's shape"):
        from_module(
            Bare(), prior=CentredNormalPrior({"out.weight": torch.zeros(10, 16)}), init="module"
        )
    centres = dict(from_module(Bare(), init="module").net_means())
    centres["out.weigth"] = centres["out.weight"]  # a misspelt extra name
    with pytest.raises(ValueError, match=r"centres \['out.weigth'\] that name no site"):
        from_module(Bare(), prior=CentredNormalPrior(centres), init="module")
    with pytest.raises(ValueError, match="scale must be a positive number"):
        CentredNormalPrior(net, scale=0)
    with pytest.raises(TypeError, match="weights must be an nn.Module or a mapping"):
        CentredNormalPrior([1, 2])
