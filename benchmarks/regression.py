"""Calibration of every family on real regression data: scikit-learn's bundled data sets.

    python benchmarks/regression.py                          # the table in benchmarks/README.md
    python benchmarks/regression.py --datasets diabetes --splits 2 --families diagonal

Per data set (diabetes: 442 x 10 -> 1; linnerud: 20 x 3 -> 3; friedman1: 1,000 x 10 -> 1) and
random 90/10 split (seeded), inputs and targets are standardised on the training part, a
one-hidden-layer MLP of 50 units with a learned noise is fitted full-batch, and the test points are
scored in the original units of the targets: RMSE, the log predictive density per target value (the
mixture over sampled networks; higher is better) and the coverage of the central 95% interval. Each
row is a family with a fixed ``N(0, 1)`` prior, a fixed ``N(0, 1/fan_in)`` (``layerwise``), a
learned scale per layer (type-II maximum likelihood), a hierarchical one (``zoo.priors.fitted``) or
the model's default (``default``: ``prior=None``); "deterministic" is a point-mass network with a
learned noise (weight decay from the fixed or the default prior), MC dropout (``p = 0.05``) the
literature's baseline. Means and standard errors are over splits; every row sees the same splits.
The fit recipe is ``zoo.REGRESSION_FIT`` unless ``--num-steps``/``--lr`` change it;
``--num-steps auto`` stops each fit by ``zoo.training.convergence``'s rule (the record's ``steps``
and ``stopped`` say where and why). The table and every fit's scores go to ``--out``
(``benchmarks/suite.py``'s result).

Fits run in ``--workers`` processes of one thread each (this small net is dominated by per-step
overhead, which threads do not help); note the machine's load with the figures.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

import suite
import torch

import guides

#: The weight priors a row can have: ``N(0, 1)``, ``N(0, 1/fan_in)``, a learned scale per
#: layer, a latent scale per layer, and the model's own default (``prior=None``).
PRIORS = ("fixed", "layerwise", "learned", "hierarchical", "default")
#: Priors that also get a deterministic row (a point-mass network: weight decay).
DETERMINISTIC_PRIORS = ("fixed", "default")

#: The data sets, and the random 90/10 splits each row is fitted on when ``--splits`` is not
#: given. Linnerud's test part is two patients (six target values) per split, so its coverage
#: has a standard error of several points even over five splits. Scikit-learn bundles no other
#: regression set (the rest download), nor does any other installed package; ``friedman1`` is
#: its generator's classic benchmark, with a known noise level.
DEFAULT_SPLITS = {"diabetes": 5, "linnerud": 5, "friedman1": 5}
#: The field's baselines as rows (``--baselines``), each with the model's default prior (its
#: MAP fits' weight decay; Laplace then fits its own prior precision by marginal likelihood):
#: laplace-torch's last-layer KFAC, all weights with a dense Hessian (601 for the 50-unit net
#: on ten inputs), and five MAP networks, each fitted with the same recipe as a family's row.
BASELINES = {
    "laplace LL-KFAC": ("laplace", {"prior_precision": "marglik"}),
    "laplace full": (
        "laplace",
        {"weights": "all", "hessian": "full", "prior_precision": "marglik"},
    ),
    "ensemble 5 MAP": ("ensemble", {"members": 5}),
}


def load(name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)`` of a data set, float32, ``y`` of shape ``(N,)`` or ``(N, D)``: scikit-learn's
    two bundled regression sets, and Friedman's first benchmark function from its generator
    (1,000 points, seed 0, noise sd 1: the best possible test RMSE is about 1.0 and the best
    log-likelihood per value about ``-log(sqrt(2 pi e)) = -1.419``)."""
    from sklearn import datasets

    if name == "friedman1":
        x, y = datasets.make_friedman1(n_samples=1000, noise=1.0, random_state=0)
    else:
        loader = {"diabetes": datasets.load_diabetes, "linnerud": datasets.load_linnerud}[name]
        x, y = loader(return_X_y=True)
    return torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.float32)


def split(x, y, seed: int, test_fraction: float = 0.1):
    """A random 90/10 split, standardised on the training part: ``(train, test, y_mean,
    y_sd)``, where ``test`` keeps the targets in their original units."""
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    n_test = max(1, round(test_fraction * len(x)))
    test, train = perm[:n_test], perm[n_test:]
    x_mean, x_sd = x[train].mean(0), x[train].std(0).clamp_min(1e-8)
    y_mean, y_sd = y[train].mean(0), y[train].std(0).clamp_min(1e-8)
    xs = (x - x_mean) / x_sd
    return (xs[train], (y[train] - y_mean) / y_sd), (xs[test], y[test]), y_mean, y_sd


def rows(
    families: list[str], priors: list[str], baselines: list[str] = ()
) -> list[tuple[str, str, str]]:
    """``(label, family, prior)`` of every row: each family with each prior, the
    deterministic network with the fixed and the default prior, and each of ``baselines``
    (labels of :data:`BASELINES`) with the default prior."""
    out = [("deterministic", "map", p) for p in priors if p in DETERMINISTIC_PRIORS]
    for family, prior in itertools.product(families, priors):
        if family != "map":
            out.append((family, family, prior))
    return out + [(label, BASELINES[label][0], "default") for label in baselines]


def prior_value(name: str):
    """The ``prior=`` argument of a row's model: ``fixed`` ``N(0, 1)``, ``layerwise``
    ``N(0, 1/fan_in)``, ``learned``, ``hierarchical``, ``default`` (``None``: the model's own)."""
    import zoo

    if name == "layerwise":
        return zoo.priors.LayerwiseNormalPrior()
    return {"fixed": 1.0, "default": None}.get(name, name)


def run_one(job: dict) -> dict:
    """Fit one row on one split and score it (in a worker process)."""
    torch.set_num_threads(1)
    import zoo
    from zoo import metrics
    from zoo.training.options import grouped

    x, y = load(job["dataset"])
    (xtr, ytr), (xte, yte), y_mean, y_sd = split(x, y, job["split"])
    prior = prior_value(job["prior"])
    out = ytr.shape[1] if ytr.dim() == 2 else 1
    model = zoo.models.BayesianMLP(
        xtr.shape[1], [job["hidden"]], out, task="regression", noise="learned", prior=prior
    )
    recipe = dict(zoo.REGRESSION_FIT)
    if job.get("num_steps") == "auto":  # zoo.training.convergence's rule; a constant rate (lr 1e-2)
        recipe = {"num_steps": "auto", "lr": recipe["lr"]}
    recipe.update({k: job[k] for k in ("num_steps", "lr") if job.get(k) is not None})
    args = grouped({"progress": False, **recipe})
    start = time.perf_counter()
    if job["family"] == "laplace":
        options = BASELINES[job["label"]][1]
        fit = zoo.laplace(model, (xtr, ytr), options=options, batch_size=len(xtr),
                          seed=job["split"], **args)  # fmt: skip
    elif job["family"] == "ensemble":
        members = BASELINES[job["label"]][1]["members"]
        factory = lambda: zoo.models.BayesianMLP(  # noqa: E731
            xtr.shape[1], [job["hidden"]], out, task="regression", noise="learned", prior=prior
        )
        fit = zoo.ensemble(factory, (xtr, ytr), members=members, seed=job["split"],
                           batch_size=len(xtr), **args)  # fmt: skip
    else:
        options = {"p": 0.05} if job["family"] == "mc_dropout" else {}
        family = guides.family(job["family"], **options)
        fit = zoo.fit(model, family, (xtr, ytr), batch_size=len(xtr), seed=job["split"], **args)
    seconds = time.perf_counter() - start
    pred = fit.predict(xte, num_samples=job["samples"], seed=0, progress=False)
    scale = y_sd if pred.sample_means.dim() == 3 else y_sd.reshape(())
    means = pred.sample_means * scale + y_mean
    scales = pred.sample_scales * scale
    lower, upper = (v * scale + y_mean for v in pred.interval(0.95))
    return {
        **job,
        "rmse": float((means.mean(0) - yte).pow(2).mean().sqrt()),
        "ll": -metrics.gaussian_mixture_nll(means, scales, yte),
        "coverage": metrics.interval_coverage(lower, upper, yte),
        "noise": float(pred.sample_scales.mean()),
        "seconds": seconds,
        "steps": fit.steps,
        "stopped": fit.options.get("stopped") if isinstance(fit, zoo.FitResult) else None,
    }


#: What identifies a fit in a checkpoint.
JOB_KEYS = ("dataset", "split", "label", "family", "prior", "hidden", "num_steps", "lr", "samples")


def _job_key(job: dict) -> tuple:
    return tuple(job[k] for k in JOB_KEYS)


def run_jobs(jobs: list[dict], workers: int, checkpoint: str | None = None) -> list[dict]:
    """Every job's scores, in the order of ``jobs``; with a ``checkpoint`` file, the fits
    found in it are reused and each new one is appended (one JSON object per line) as it ends."""
    done = {}
    if checkpoint and os.path.exists(checkpoint):
        with open(checkpoint) as f:
            for line in f:
                if line.strip():
                    result = json.loads(line)
                    done[_job_key(result)] = result
    todo = [job for job in jobs if _job_key(job) not in done]
    if done:
        print(f"{len(jobs) - len(todo)} fits read from {checkpoint}, {len(todo)} to run")
    with ProcessPoolExecutor(workers) as pool:
        futures = [pool.submit(run_one, job) for job in todo]
        for future in as_completed(futures):
            result = future.result()
            done[_job_key(result)] = result
            if checkpoint:
                with open(checkpoint, "a") as f:
                    f.write(json.dumps(result) + "\n")
                    f.flush()
                    os.fsync(f.fileno())
    return [done[_job_key(job)] for job in jobs]


def mean_se(values: list[float]) -> tuple[float, float]:
    """The mean of ``values`` and its standard error (NaN for a single value)."""
    n = len(values)
    se = statistics.stdev(values) / math.sqrt(n) if n > 1 else math.nan
    return statistics.fmean(values), se


def summarise(results: list[dict]) -> list[dict]:
    """Mean and standard error over splits per (dataset, label, prior)."""
    table = []
    keys = dict.fromkeys((r["dataset"], r["label"], r["prior"]) for r in results)
    for dataset, label, prior in keys:
        group = [
            r for r in results if (r["dataset"], r["label"], r["prior"]) == (dataset, label, prior)
        ]
        row = {"dataset": dataset, "family": label, "prior": prior, "splits": len(group)}
        for key in ("rmse", "ll", "coverage", "noise", "seconds"):
            row[key], row[key + "_se"] = mean_se([r[key] for r in group])
        table.append(row)
    return table


def print_table(table: list[dict]) -> None:
    print(
        "| data | family | prior | splits | test RMSE | test log-lik. per value | 95% coverage "
        "| noise sd (std. units) | fit s |"
    )
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in table:
        print(
            f"| {r['dataset']} | {r['family']} | {r['prior']} | {r['splits']} | {r['rmse']:.2f} ± "
            f"{r['rmse_se']:.2f} | {r['ll']:.3f} ± {r['ll_se']:.3f} | {r['coverage']:.3f} ± "
            f"{r['coverage_se']:.3f} | {r['noise']:.3f} | {r['seconds']:.0f} |"
        )


def mean_baseline(dataset: str, splits: int) -> tuple[float, float]:
    """Test RMSE (mean and standard error over splits) of predicting every test target by the
    training part's mean: what a net that learned nothing scores."""
    x, y = load(dataset)
    values = []
    for s in range(splits):
        _, (_, y_test), y_mean, _ = split(x, y, s)
        values.append(float((y_test - y_mean).pow(2).mean().sqrt()))
    return mean_se(values)


def print_baselines(datasets: list[str], splits: int | None) -> None:
    """One row per data set: the training mean as the prediction (RMSE only)."""
    for d in datasets:
        n = splits or DEFAULT_SPLITS[d]
        rmse, se = mean_baseline(d, n)
        print(f"| {d} | training mean | - | {n} | {rmse:.2f} ± {se:.2f} | - | - | - | - |")


def main(argv: list[str] | None = None) -> list[dict]:
    import guides

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--datasets", nargs="+", default=list(DEFAULT_SPLITS))
    parser.add_argument(
        "--splits", type=int, default=None, help=f"per data set (default: {DEFAULT_SPLITS})"
    )
    parser.add_argument("--families", nargs="+", default=guides.available())
    parser.add_argument("--priors", nargs="+", default=list(PRIORS), choices=PRIORS)
    parser.add_argument(
        "--baselines",
        nargs="*",
        default=[],
        choices=list(BASELINES),
        help="also these baseline rows, with the default prior (laplace-torch for Laplace)",
    )
    parser.add_argument("--hidden", type=int, default=50)
    parser.add_argument(
        "--num-steps",
        type=lambda v: v if v == "auto" else int(v),
        default=None,
        help="an int, or 'auto' (stop on convergence, zoo.training.convergence); "
        "default: REGRESSION_FIT",
    )
    parser.add_argument("--lr", type=float, default=None, help="default: REGRESSION_FIT")
    parser.add_argument("--samples", type=int, default=200, help="networks drawn per test point")
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--out", help="default: benchmarks/results/regression.json")
    parser.add_argument(
        "--checkpoint",
        default=None,
        help="a JSON-lines file: each fit is appended as it ends, and fits already in it are "
        "not run again (resume an interrupted run with the same arguments)",
    )
    args = parser.parse_args(argv)
    families = [f for f in args.families if f not in ("mixed",)]
    jobs = [
        {
            "dataset": d,
            "split": s,
            "label": label,
            "family": family,
            "prior": prior,
            "hidden": args.hidden,
            "num_steps": args.num_steps,
            "lr": args.lr,
            "samples": args.samples,
        }
        for d in args.datasets
        for s in range(args.splits or DEFAULT_SPLITS[d])
        for label, family, prior in rows(families, args.priors, args.baselines)
    ]
    with suite.record("regression", args.out, argv) as run:
        print(f"{len(jobs)} fits, {args.workers} workers of one thread")
        results = run_jobs(jobs, args.workers, args.checkpoint)
        table = summarise(results)
        print_table(table)
        print_baselines(args.datasets, args.splits)
        run.data = {"fits": results}
    return table


if __name__ == "__main__":
    main()
