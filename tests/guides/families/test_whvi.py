"""Walsh-Hadamard VI (guides.AutoWHVI): the fast transform against Sylvester's recursion, every
weight against the dense product written out with that matrix (padding, stacked blocks, a
convolution kernel), the moments and dense covariance of vec(W) against J Sigma J^T and Monte
Carlo, the log-density and KL against torch's MultivariateNormal on g, the exact posterior of a
conjugate regression in g (where the model's own prior must cancel), and refusals."""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import SVI, Trace_ELBO, TraceMeanField_ELBO
from torch.distributions import MultivariateNormal, kl_divergence

import guides
from guides.families.whvi import FULL_MAX, WHVISite, initial_mean
from guides.walsh_hadamard import DENSE_MAX, WalshHadamardLayout, fwht, hadamard
from zoo.models import BayesianMLP

SHAPES = [(5, 3), (3, 6), (4, 2, 3, 3), (9, 4), (1, 1)]
#: (shape, block_size): the paper's blocks, one wide, and grids of smaller blocks (padding on
#: both sides, several rows and columns of blocks, a convolution kernel)
CASES = [(shape, None) for shape in SHAPES] + [((5, 3), 2), ((3, 6), 4), ((4, 2, 3, 3), 8),
                                                ((9, 12), 4)]  # fmt: skip


def sylvester(d: int) -> torch.Tensor:
    """H by its recursion ``H_2n = [[H, H], [H, -H]]``: independent of the butterflies."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def random_site(shape, seed=0, **options) -> WHVISite:
    """A site with every parameter perturbed; the paper's blocks unless ``block_size`` given."""
    options.setdefault("block_size", None)
    torch.manual_seed(seed)
    site = WHVISite(torch.randn(shape, dtype=torch.float64), 0.3, **options)
    with torch.no_grad():
        for p in site.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return site


def dense_weight(site: WHVISite, g: torch.Tensor) -> torch.Tensor:
    """W from the definition: pad, lay out the grid of blocks ``diag(s1) H diag(g_k) H
    diag(s2) / D`` (block ``k = a column_blocks + b``; ``s2`` one row per row of blocks),
    slice, reshape; ``s1`` padded with ones past ``out``, ``s2`` past the columns."""
    lay = site.layout.on(site.gather, site.block)
    rows, cols, d = lay.row_blocks, lay.column_blocks, lay.size
    h = sylvester(d)
    s1 = torch.ones(rows * d, dtype=torch.float64)
    s1[: lay.out] = site.s1.detach()
    s2 = torch.ones(rows, cols * d, dtype=torch.float64)
    s2[:, : lay.cols] = site.s2.detach()
    w = torch.zeros(rows * d, cols * d, dtype=torch.float64)
    for a in range(rows):
        for b in range(cols):
            left = torch.diag(s1[a * d : (a + 1) * d]) @ h @ torch.diag(g[a * cols + b])
            w[a * d : (a + 1) * d, b * d : (b + 1) * d] = (
                left @ h @ torch.diag(s2[a, b * d : (b + 1) * d]) / d
            )
    return w[: lay.out, : lay.cols].reshape(lay.shape)


@pytest.mark.parametrize("d", [1, 2, 4, 8, 32, 128])
def test_fast_transform_is_the_dense_matrix(d):
    x = torch.randn(3, 2, d, dtype=torch.float64)
    assert torch.allclose(fwht(x), x @ sylvester(d).T)
    assert torch.equal(hadamard(d), sylvester(d))
    with pytest.raises(ValueError, match="power-of-two length, got 6"):
        fwht(torch.ones(6))


@pytest.mark.parametrize("shape, block_size", CASES, ids=str)
def test_each_draw_is_the_dense_product(shape, block_size):
    site = random_site(shape, block_size=block_size)
    q = site.distribution()
    w = q.rsample((3,))
    g = q._drawn[2]
    for i in range(3):
        assert torch.allclose(w[i], dense_weight(site, g[i]))
    assert torch.allclose(q.mean, dense_weight(site, site.loc.detach()))


def test_large_blocks_take_the_butterflies_and_small_ones_the_dense_matrix():
    """Both paths give the dense definition (the other tests run small blocks)."""
    big = random_site((3, DENSE_MAX + 1))  # D = 2 DENSE_MAX: the butterfly stages
    small = random_site((3, DENSE_MAX))
    assert big.dense is None and torch.equal(small.dense, sylvester(DENSE_MAX))
    for site in (big, small):
        q = site.distribution()
        w = q.rsample()
        assert torch.allclose(w, dense_weight(site, q._drawn[2]))
        x = torch.randn(4, site.layout.cols, dtype=torch.float64)
        torch.manual_seed(3)
        local = q.local_linear(x, None)
        torch.manual_seed(3)
        eps = torch.randn((4,) + site.loc.shape, dtype=torch.float64)
        g = q._latent(eps)
        expected = torch.stack([x[i] @ dense_weight(site, g[i]).T for i in range(4)])
        assert torch.allclose(local, expected)


def test_layout_pads_columns_and_stacks_blocks():
    lay = WalshHadamardLayout(torch.Size([40, 2, 3, 3]))  # 18 columns: D = 32, K = 2
    assert (lay.size, lay.blocks, lay.cols) == (32, 2, 18)
    assert lay.gather.shape == (40, 18) and int(lay.gather.max()) < 64
    assert WalshHadamardLayout(torch.Size([7, 16])).size == 16  # a power of two stays
    grid = WalshHadamardLayout(torch.Size([40, 2, 3, 3]), block_size=8)  # 5 x 3 blocks of 8
    assert (grid.size, grid.row_blocks, grid.column_blocks, grid.blocks) == (8, 5, 3, 15)
    assert sorted(set(grid.gather.reshape(-1).tolist())) == list(range(15 * 8))
    assert WalshHadamardLayout(torch.Size([3, 6]), block_size=64).size == 8  # never wider


@pytest.mark.parametrize("shape", [(5, 3), (3, 2, 2)], ids=str)
@pytest.mark.parametrize("covariance", ["full", "diagonal"])
def test_moments_are_j_sigma_j_transposed_and_monte_carlo(shape, covariance):
    site = random_site(shape, covariance=covariance)
    q = site.distribution()
    k, d = site.loc.shape
    # J = d vec(W) / d g from the dense definition, column by column
    basis = torch.eye(k * d, dtype=torch.float64).reshape(k * d, k, d)
    jac = torch.stack([dense_weight(site, e).reshape(-1) for e in basis], 1)
    tril = torch.block_diag(*q.scale_tril().detach())
    cov = jac @ tril @ tril.T @ jac.T
    with torch.no_grad():
        assert torch.allclose(q.covariance_matrix, cov)
        assert torch.allclose(q.variance.reshape(-1), cov.diagonal())
        draws = q.sample((100_000,)).reshape(100_000, -1)
    sd = cov.diagonal().max() ** 0.5
    assert torch.allclose(draws.mean(0), q.mean.reshape(-1), atol=5 * sd / 300)
    assert torch.allclose(torch.cov(draws.T), cov, atol=0.02 * cov.abs().max())
    if covariance == "full":
        assert (cov - torch.diag(cov.diagonal())).abs().max() > 0.05 * cov.abs().max()


@pytest.mark.parametrize("shape, block_size", [((5, 3), None), ((3, 6), None), ((5, 6), 2)],
                         ids=str)  # fmt: skip
def test_local_product_has_the_outputs_distribution_per_row(shape, block_size):
    """estimator="local": one g per row of x through the fast transform; each row's output
    has the mean and covariance of x W^T under q, rows independent of each other."""
    site = random_site(shape, block_size=block_size)
    q = site.distribution()
    x = torch.randn(2, shape[1], dtype=torch.float64)
    bias = torch.randn(shape[0], dtype=torch.float64)
    n = 60_000
    with torch.no_grad():
        local = q.local_linear(x.expand(n, 2, -1), bias)  # (n, 2, out)
        dense = x @ q.sample((n,)).mT + bias  # shared W per draw: (n, 2, out)
        cov = q.covariance_matrix
    for row in range(2):
        jac = torch.kron(torch.eye(shape[0], dtype=x.dtype), x[row])  # vec(W) -> W x_row
        exact = jac @ cov @ jac.T
        assert torch.allclose(local[:, row].mean(0), dense[:, row].mean(0), atol=0.03)
        assert torch.allclose(torch.cov(local[:, row].T), exact, atol=0.03 * exact.abs().max())
    across = torch.cov(torch.cat([local[:, 0], local[:, 1]], 1).T)[: shape[0], shape[0] :]
    spread = local.var(0).max()  # a cross-covariance of zero, within 5 Monte Carlo errors
    assert across.abs().max() < 5 * spread / n**0.5
    shared = torch.cov(torch.cat([dense[:, 0], dense[:, 1]], 1).T)[: shape[0], shape[0] :]
    assert shared.abs().max() > 10 * spread / n**0.5  # one W for both rows: correlated


def test_log_prob_is_q_over_p_of_g_plus_the_sites_prior_and_kl_is_on_g():
    site = random_site((5, 3))
    prior = dist.Normal(0.0, 0.7).expand([5, 3]).to_event(2)
    site.prior = prior
    q = site.distribution()
    w = q.rsample((4,))
    g = q._drawn[2]
    tril = q.scale_tril()
    mvn = MultivariateNormal(site.loc, scale_tril=tril)  # batch K, event D
    std = MultivariateNormal(torch.zeros_like(site.loc), torch.eye(site.loc.shape[-1]).double())
    expected = (mvn.log_prob(g) - std.log_prob(g)).sum(-1) + prior.log_prob(w)
    assert torch.allclose(q.log_prob(w), expected)
    assert torch.allclose(kl_divergence(q, prior), kl_divergence(mvn, std).sum())
    with pytest.raises(ValueError, match="own draws"):
        q.log_prob(w.clone())
    m = q.mean_value()  # g = loc
    at_mean = mvn.log_prob(site.loc) - std.log_prob(site.loc)
    assert torch.allclose(q.log_prob(m), at_mean.sum() + prior.log_prob(m))


@pytest.mark.slow  # quick tier: under three minutes
def test_the_model_prior_cancels_and_the_conjugate_posterior_of_g_is_reached():
    """y = W x + noise with one row of WHVI weights and fixed scales: y is linear in g, so
    q(g) can equal the exact Gaussian posterior under p(g) = N(0, I), whatever prior the
    model states on W (0.3 here: were it not cancelled, q would be pulled towards it)."""
    gen = torch.Generator().manual_seed(0)
    n, cols, noise = 200, 4, 0.5
    x = torch.randn(n, cols, generator=gen, dtype=torch.float64)
    y = x @ torch.tensor([1.0, -0.5, 0.3, 0.8], dtype=torch.float64)
    y = y + noise * torch.randn(n, generator=gen, dtype=torch.float64)

    def model(x, y=None):
        prior = dist.Normal(torch.tensor(0.0, dtype=x.dtype), 0.3).expand([1, cols])
        w = pyro.sample("w", prior.to_event(2))
        with pyro.plate("data", len(x)):  # w's row against each x: batch (particles, n)
            pyro.sample("obs", dist.Normal((w[..., 0, :] * x).sum(-1), noise), obs=y)

    # W_0j = (H g)_j / D with S1 = S2 = 1: y = Phi g with Phi = x H / D
    d = 4
    phi = x @ sylvester(d) / d
    precision = torch.eye(d, dtype=x.dtype) + phi.T @ phi / noise**2
    cov = torch.linalg.inv(precision)
    mean = cov @ phi.T @ y / noise**2

    pyro.set_rng_seed(0)
    guide = guides.AutoWHVI(model, learn_scales=False, init_scale=0.5)
    guide(x, y)
    optim = pyro.optim.ClippedAdam({"lr": 0.05, "lrd": 0.998})
    svi = SVI(model, guide, optim, Trace_ELBO(16, 1, vectorize_particles=True))
    for _ in range(3000):
        svi.step(x, y)
    q = guide.get_posterior("w")
    fitted = MultivariateNormal(q.loc[0].detach(), scale_tril=q.scale_tril()[0].detach())
    exact = MultivariateNormal(mean, cov)
    assert kl_divergence(fitted, exact) < 0.01  # measured 0.0006


def test_mixed_gives_one_site_whvi_and_its_prior_reaches_it():
    model = BayesianMLP(3, (8,), 2, task="classification")
    guide = guides.AutoMixed(model, {"fc1.weight": "whvi", "*": "diagonal"})
    x, y = torch.randn(6, 3), torch.randint(0, 2, (6,))
    guide(x, y)
    assert isinstance(guide.site_posterior("fc1.weight"), WHVISite)
    assert guide.site_posterior("fc1.weight").prior is not None
    for elbo in (Trace_ELBO(), TraceMeanField_ELBO()):
        assert torch.isfinite(elbo.differentiable_loss(model, guide, x, y))


def test_the_prior_moves_with_the_site():
    """What a GPU fit needs (guide.to(device) after set-up), checked with a dtype on the CPU."""
    model = BayesianMLP(3, (8,), 2, task="classification")
    guide = guides.AutoWHVI(model)
    guide(torch.randn(2, 3), torch.zeros(2).long())
    guide.double()
    site = guide.site_posterior("fc1.weight")
    held = [v for v in vars(site.prior).values() if torch.is_tensor(v) and v.is_floating_point()]
    assert held and all(v.dtype == torch.float64 for v in held)
    q = site.distribution()
    assert q.log_prob(q.rsample()).dtype == torch.float64


def test_refusals_before_any_work():
    model = BayesianMLP(3, (8,), 2, task="classification")
    with pytest.raises(ValueError, match="covariance must be one of"):
        guides.AutoWHVI(model, covariance="dense")(torch.randn(2, 3), torch.zeros(2).long())
    with pytest.raises(TypeError, match="unknown option"):
        guides.AutoWHVI(model, prior=None)
    wide = BayesianMLP(FULL_MAX + 1, (), 2, task="classification")
    x, y = torch.randn(2, FULL_MAX + 1), torch.zeros(2).long()
    with pytest.raises(ValueError, match=r"D = 8192 .* covariance='diagonal', or block_size"):
        guides.AutoWHVI(wide, block_size=None)(x, y)  # the paper's blocks: one of 8,192
    guides.AutoWHVI(wide, covariance="diagonal", block_size=None)(x, y)
    pyro.clear_param_store()  # the guides above were called directly (Pyro's store)
    guides.AutoWHVI(wide, block_size=256)(x, y)  # smaller blocks: a full covariance fits
    for bad in (0, 1, 6, 2.0, True, "16"):
        with pytest.raises(ValueError, match="block_size must be None .* power of two"):
            guides.AutoWHVI(model, block_size=bad)  # when the guide is built, before any work
    for prior in ("learned", "hierarchical"):
        fitted = BayesianMLP(3, (8,), 2, task="classification", prior=prior)
        with pytest.raises(ValueError, match=r"carries its own prior .* 'fc1.weight'"):
            guides.AutoWHVI(fitted)(torch.randn(2, 3), torch.zeros(2).long())


@pytest.mark.parametrize("shape, block_size", [((5, 3), None), ((2, 3, 3), None), ((5, 9), 4)],
                         ids=str)  # fmt: skip
def test_initial_mean_is_the_diagonal_of_h_b_h(shape, block_size):
    init = torch.randn(shape, dtype=torch.float64)
    lay = WalshHadamardLayout(torch.Size(shape), block_size=block_size)
    k, d = lay.blocks, lay.size
    padded = torch.zeros(lay.row_blocks * d, lay.column_blocks * d, dtype=torch.float64)
    padded[: lay.out, : lay.cols] = init.reshape(lay.out, lay.cols)
    h = sylvester(d)
    blocks = padded.reshape(lay.row_blocks, d, lay.column_blocks, d).transpose(1, 2)
    diag = torch.stack([(h @ b @ h).diagonal() for b in blocks.reshape(k, d, d)])
    filled = lay.out * lay.cols / (k * d * d)
    assert torch.allclose(initial_mean(init, lay), diag / math.sqrt(d * filled))


def test_initial_mean_keeps_the_weights_scale():
    torch.manual_seed(0)
    init = torch.randn(400, 784, dtype=torch.float64) * 0.05
    site = WHVISite(init, 0.01)
    q = site.distribution()
    assert q.mean.std().item() == pytest.approx(0.05, rel=0.1)
    assert q.variance.sqrt().mean().item() == pytest.approx(0.01, rel=0.05)


def test_given_weights_and_truthy_strings_are_refused():
    """WHVI's mean cannot take given weights (Pyro's contract: start there, or refuse), and
    ``learn_scales="no"`` is not read as true."""
    model = BayesianMLP(3, (8,), 2, task="classification")
    with pytest.raises(ValueError, match="cannot start at given weights"):
        guides.AutoWHVI(model, init_loc_fn=lambda site: site["value"])
    with pytest.raises(ValueError, match="cannot start at given weights"):
        guides.AutoWHVI(model, init_module=model.net)
    with pytest.raises(ValueError, match="learn_scales must be True or False, got 'no'"):
        guides.AutoWHVI(model, learn_scales="no")
    with pytest.raises(ValueError, match="learn_scales must be True or False"):
        guides.family("whvi", learn_scales="no").build(model) if hasattr(
            guides.family("whvi"), "build"
        ) else guides.instantiate(guides.family("whvi", learn_scales="no"), model, {})


@pytest.mark.parametrize("learn_scales", [True, False])
def test_the_stored_numbers_are_in_units_of_one_step(learn_scales):
    """mu is stored divided by sqrt(D), S1 and S2 by sqrt(n): an Adam step of size delta on
    every stored number moves a weight about as far as a diagonal mean's step (the module's
    "Parameterisation")."""
    site = random_site((5, 12), learn_scales=learn_scales)
    d, n = site.loc.shape[-1], 12
    assert torch.equal(site.loc, site.mean_g * math.sqrt(d))
    assert torch.equal(site.s1, site.row_scale * math.sqrt(n))
    assert torch.equal(site.s2, site.column_scale * math.sqrt(n))
    fresh = WHVISite(torch.randn(5, 12, dtype=torch.float64), 0.3, learn_scales=learn_scales)
    assert torch.allclose(fresh.s1, torch.ones(5, dtype=torch.float64))
    # a step of 1e-3 on every stored mean: weights move by about 1e-3 (a diagonal mean's step)
    before = fresh.distribution().mean
    with torch.no_grad():
        fresh.mean_g.add_(1e-3 * torch.sign(torch.randn_like(fresh.mean_g)))
    moved = (fresh.distribution().mean - before).abs().mean()
    assert 2e-4 < moved < 2e-3


@pytest.mark.parametrize("learn_scales", [True, False])
def test_a_state_saved_before_the_units_loads_as_the_same_posterior(learn_scales):
    """A WHVI state of release 0.3 (loc, s1, s2 as they are) is rewritten on loading."""
    from zoo.storage.guide_form import upgraded

    site = random_site((5, 12), learn_scales=learn_scales)
    suffix = "_unconstrained" if learn_scales else ""
    old = {k: v for k, v in site.state_dict().items() if k.startswith(("rho", "lower"))}
    old["loc_unconstrained"] = site.loc.detach().clone()
    old[f"s1{suffix}"] = site.s1.detach().clone()
    old[f"s2{suffix}"] = site.s2.detach().clone()
    zeros = torch.zeros(5, 12, dtype=torch.float64)  # release 0.3 had the paper's blocks only
    other = WHVISite(zeros, 0.1, learn_scales=learn_scales, block_size=None)
    other.load_state_dict(upgraded(other, old))
    assert torch.allclose(other.distribution().mean, site.distribution().mean)
    assert torch.allclose(other.loc, site.loc) and torch.allclose(other.s2, site.s2)
    current = site.state_dict()  # today's state passes through untouched
    assert upgraded(site, current).keys() == current.keys()


def test_the_block_size_is_saved_and_a_spec_without_one_has_the_papers_blocks():
    """The block size decides the parameters' shapes, so every spec records it; a spec of a
    release before it (no block_size) rebuilds the paper's one-block layout, for the family
    and for a WHVI rule of AutoMixed and AutoJoint's rest alike."""
    from guides.families.whvi import DEFAULT_BLOCK_SIZE
    from guides.site import direct_parameters

    model = BayesianMLP(20, (12,), 3, task="classification")
    x, y = torch.randn(4, 20), torch.randint(0, 3, (4,))

    def sizes(guide) -> dict:
        with direct_parameters():  # no global store: rebuilt guides take the same names
            guide(x, y)
        return {n: m.layout.size for n, m in guide.named_modules() if isinstance(m, WHVISite)}

    def whvi_options(name: str, spec: dict) -> list[dict]:
        if name == "mixed":
            return [options for _, family, options in spec["rules"] if family == "whvi"]
        return [spec["options"]["rest"][1] if name == "joint" else spec["options"]]

    built = {
        "whvi": guides.AutoWHVI(model),
        "mixed": guides.AutoMixed(model, {"fc1.weight": "whvi", "*": "diagonal"}),
        "joint": guides.AutoJoint(model, sites="fc2.*", rest="whvi"),
    }
    for name, guide in built.items():
        assert set(sizes(guide).values()) == {DEFAULT_BLOCK_SIZE}, name
        spec = guide.spec()
        assert sizes(guides.registry.build(model, spec)) == sizes(guide), name
        saved = whvi_options(name, spec)
        assert [o["block_size"] for o in saved] == [DEFAULT_BLOCK_SIZE], name
        saved[0].pop("block_size")  # as a spec written before the option
        paper = {32, 16} if name == "whvi" else {32}  # D: the next power of two of the columns
        assert set(sizes(guides.registry.build(model, spec)).values()) == paper, name
    given = guides.AutoWHVI(model, block_size=4)
    assert set(sizes(guides.registry.build(model, given.spec())).values()) == {4}
