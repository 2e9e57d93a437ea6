"""Write fits in the v1 (pickled) format with the code of the checkout on PYTHONPATH, plus the
posterior moments each one had (plain tensors), for tests/zoo/results/test_loading.py."""

import sys
from pathlib import Path

import torch

import guides
import zoo

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
torch.manual_seed(0)
x = torch.randn(40, 3)
y = (x[:, 0] > 0).long()
xr = torch.randn(40, 3)
yr = xr.sum(-1) * 0.5
cases = {
    "diagonal": ("classification", "diagonal", {}),
    "lowrank": ("classification", "lowrank", {"rank": 2}),
    "tridiagonal": ("classification", "tridiagonal", {}),
    "tridiagonal_free": ("classification", "tridiagonal", {"parameterization": "free"}),
    "matrix_normal": ("classification", "matrix_normal", {}),
    "mixed": ("classification", None, {}),
    "regression_learned": ("regression", "diagonal", {}),
}
reference = {}
for label, (task, family, options) in cases.items():
    if task == "classification":
        model = zoo.models.BayesianMLP(3, (5,), 2, task="classification")
        data = (x, y)
    else:
        model = zoo.models.BayesianMLP(3, (5,), 1, task="regression", noise="learned")
        data = (xr, yr)
    guide = (
        family if family else (lambda m: guides.AutoMixed(m, {"fc2.*": "lowrank", "*": "diagonal"}))
    )
    fit = zoo.fit(
        model,
        guides.family(guide, **options if family else None),
        data,
        num_steps=30,
        batch_size=20,
        lr=0.01,
        run=zoo.Run(progress=False),
    )
    fit.save(out / f"{label}.pt")
    moments = {}
    for name in fit.guide.site_names:
        d = fit.guide.get_posterior(name)
        moments[name + ":median"] = fit.guide.median()[name].detach().clone()
        if not isinstance(d, torch.distributions.TransformedDistribution):
            moments[name + ":variance"] = d.variance.detach().clone()
    moments["probs"] = (
        zoo.predict(
            model,
            fit.guide,
            x[:5],
            num_samples=3,
            params={k: v.unsqueeze(0).expand(3, *v.shape) for k, v in fit.guide.median().items()},
            progress=False,
        )
        .outputs.detach()
        .clone()
    )
    reference[label] = moments
torch.save(reference, out / "reference.pt")
print(sorted(p.name for p in out.iterdir()))
