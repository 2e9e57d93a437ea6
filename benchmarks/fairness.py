"""Is the default call each family's best? The default fit of every family and baseline
against the best of a small grid on the project's own problems (issue 60).

    python benchmarks/fairness.py                                  # every problem
    python benchmarks/fairness.py --problems digits --families whvi diagonal

For each problem and each family (``guides.available()``, the joint Gaussian where the network
is small enough, and the baselines ``ensemble`` and ``laplace``), the call ``zoo.compare``
makes with no learning rate or initial scale given (the family's recipe,
``guides.recipe``) is set beside a grid of the same step budget: the learning rate ``x 0.3,
1, 3, 10`` of the rate the default call runs at (the task's default, 3e-3, or 1e-2 for the
full-batch recipe of small regression data, times the family's scale,
``guides.Recipe.scale``) times two
initial scales (the family's default ``init_scale`` and 3 times it; the Posch tridiagonal's
relative ``init_tau``; MAP and the baselines' MAP fits take the learning rates only). The
score is the test NLL per point; the gap is ``default - best``. Problems:

- ``toy``: ``zoo.data.toy_regression`` (160 train, 500 test), 1-50-50-1 ReLU, fixed noise 0.1,
  the full-batch recipe (3,000 steps);
- ``diabetes``: scikit-learn's (``benchmarks/reference.py``'s split), 10-16-1 ReLU with a
  learned noise, the full-batch recipe;
- ``digits``: scikit-learn's 8x8 digits (1,438 train), 64-32-10 ReLU, 10 epochs at batch 128;
- ``mnist``: 2,000 MNIST training digits, LeNet-5, 5 epochs at batch 128, tested on 2,000 of
  the test set (``--data-root``, or ``ZOO_DATA``);
- ``resnet``: the same 2,000 digits and 5 epochs with a ResNet-8 (batch norm; 74,522 weights
  in sample sites), tested on 1,000.

Two problems outside the table (``HELD_OUT``: not in the default ``--problems``), on which the
range test's rule was not chosen, test a rule read off the table's sweeps
(``benchmarks/rate_rules.py``): ``cnn``, the same 2,000 digits and 5 epochs with a small
batch-norm CNN from scratch (two 3x3 convolutions of 16 and 32 channels, each with batch norm,
ReLU and 2x2 max pooling, then a linear layer; ``zoo.models.from_module(..., init="fresh")``),
and ``mlp``, the same with a 784-100-10 ReLU MLP on the flattened images; both tested on 2,000.

Every default rate decays tenfold over the run (``zoo.fit``'s default, minibatch and full-batch
alike), and the grid's rates decay the same way.

The grid runs at seed 0, so its best is the best of several noisy fits: ``--best-seeds 1 2
--merge saved.json`` fits each saved row's best setting again at the default call's other
seeds, and the verdict then reads the gap averaged over the seeds both have (the seed-0 gap
is printed beside it).

``--kl-weight W`` fits every job of the run with the KL weighted by ``W``
(``zoo.Loss(kl_weight=W)``, a tempered objective; the variational families only, each
result records the weight): what a tempered default would do to rows fitted at the true ELBO,
its default calls read against the table's grids by :func:`refitted_rows`.

Fits run in ``--processes`` worker processes of one thread each. Results go to ``--out`` (JSON:
every fit's setting and metrics); the table printed is the one in ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import sys
import time

import torch
from saving import write_json

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

PROBLEMS = ("toy", "diabetes", "digits", "mnist", "resnet")
HELD_OUT = ("cnn", "mlp")
LR_FACTORS = (0.3, 1.0, 3.0, 10.0)
INIT_FACTORS = (1.0, 3.0)
BASELINES = ("ensemble", "laplace")
#: The problems fitted with the full-batch recipe of small regression data.
FULL_BATCH = ("toy", "diabetes")
#: The joint Gaussian is fitted where the network has at most this many weights.
JOINT_MAX = 1500
#: The MNIST training digits every MNIST problem fits (the first ones); held-out digits are
#: the ones after them (:func:`validation_digits`).
MNIST_TRAIN = 2000
#: The option that sets a family's initial spread, where it is not ``init_scale``: the Posch
#: tridiagonal's relative scale ``tau`` (its default parameterisation).
INIT_OPTIONS = {"tridiagonal": "init_tau"}


def variational() -> list[str]:
    """The variational families a fit takes by name: the registry's and the joint Gaussian."""
    import guides

    return [*guides.available(), "joint"]


def problem(name: str, data_root: str | None = None, budget: int = 1):
    """``(train, test, model_factory, fit_options, default_lr)`` of a problem (the schedule of
    every default rate is a tenfold decay), its budget ``budget`` times the short one: the
    epochs, or for the full-batch problems the recipe's 3,000 steps, every example a batch
    (a given length: its grid is centred on the task's 3e-3; the default call keeps the
    full-batch recipe's rate, ``zoo.training.recipes``)."""
    train, test, factory, options, default_lr = _problem(name, data_root)
    if budget == 1:
        return train, test, factory, options, default_lr
    from zoo.training.recipes import DEFAULT_LR, REGRESSION_FIT

    if "epochs" in options:
        return train, test, factory, {**options, "epochs": options["epochs"] * budget}, default_lr
    size = len(train[0])
    longer = {"num_steps": REGRESSION_FIT["num_steps"] * budget, "batch_size": size}
    return train, test, factory, longer, DEFAULT_LR


def _problem(name: str, data_root: str | None = None):
    import zoo
    from zoo.training.recipes import DEFAULT_LR, REGRESSION_FIT

    if name == "toy":
        train = zoo.data.toy_regression(n=160)
        test = zoo.data.toy_regression(n=500, seed=1)
        return (
            train,
            test,
            lambda: zoo.models.BayesianMLP(1, (50, 50), noise=0.1),
            {},
            REGRESSION_FIT["lr"],
        )
    if name in ("diabetes", "digits"):
        from reference import load

        train, test, _, _ = load(name)
        if name == "diabetes":
            return (
                train,
                test,
                lambda: zoo.models.BayesianMLP(10, (16,)),
                {},
                REGRESSION_FIT["lr"],
            )
        return (
            train,
            test,
            lambda: zoo.models.BayesianMLP(64, (32,), 10, task="classification"),
            {"epochs": 10, "batch_size": 128},
            DEFAULT_LR,
        )
    if name in ("mnist", "resnet", *HELD_OUT):
        root = data_root or os.environ.get("ZOO_DATA")
        test_size = 1000 if name == "resnet" else 2000
        train_set = zoo.data.mnist(root, train=True, download=False, limit=MNIST_TRAIN)
        test_set = zoo.data.mnist(root, train=False, download=False, limit=test_size)
        train = tuple(torch.stack(t) for t in zip(*train_set))
        test = tuple(torch.stack(t) for t in zip(*test_set))
        if name == "mnist":
            factory = zoo.models.LeNet5
        elif name == "cnn":
            factory = lambda: zoo.models.from_module(_cnn(), init="fresh")  # noqa: E731
        elif name == "mlp":
            train, test = (tuple([x.flatten(1), y]) for x, y in (train, test))
            factory = lambda: zoo.models.BayesianMLP(784, (100,), 10, task="classification")  # noqa: E731
        else:  # batch norm's running statistics in the model, the network users bring
            factory = lambda: zoo.models.ResNet(8, in_channels=1, input_size=28)  # noqa: E731
        return train, test, factory, {"epochs": 5, "batch_size": 128}, DEFAULT_LR
    raise ValueError(f"unknown problem {name!r}; choose from {PROBLEMS + HELD_OUT}")


def _cnn() -> torch.nn.Module:
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 10),
    )  # fmt: skip


def row_name(name: str, budget: int = 1) -> str:
    """A problem's name in the table at ``budget`` times its short budget (``"mnist x10"``)."""
    return name if budget == 1 else f"{name} x{budget}"


def given_rate(row: str, family: str, default_lr: float, times: float) -> dict:
    """``zoo.fit``'s rate options for the grid's setting ``times`` of ``family`` in the table's
    row ``row``: the task's rate ``default_lr`` times the family's short-budget scale
    (``guides.Recipe.scale``; MAP's for the baselines' MAP fits) times ``times``, decaying
    tenfold as the default call does."""
    import guides

    recipe = guides.recipe("map" if family in BASELINES else family)
    scale = recipe.scale(full_batch=row in FULL_BATCH)  # the short budget's
    return {"lr": default_lr * scale * times, "optim": {"lr_schedule": "exponential"}}


def fit_once(name: str, family: str, budget: int = 1, times: float | None = None,
             data_root: str | None = None, extra: dict | None = None, loaded=None):  # fmt: skip
    """``(model, fit, train, test)``: one ``zoo.fit`` of ``family`` on problem ``name`` at
    seed 0, its default call (``times=None``) or the grid's rate ``times`` (``given_rate``),
    with ``extra`` flat ``zoo.fit`` options over the problem's (``{"kl_weight": 0.1}``), for
    the scripts that study one row (``laplace_prior.py``, ``elbo_against_nll.py``,
    ``held_out_curve.py``); ``loaded`` is ``problem(name, data_root, budget)`` where the
    caller has it already."""
    import zoo
    from zoo.training.options import grouped

    train, test, factory, options, default_lr = loaded or problem(name, data_root, budget)
    given = {}
    if times is not None:
        given = given_rate(row_name(name, budget), family, default_lr, times)
    model = factory()
    run = grouped({"seed": 0, "progress": False, **options, **given, **(extra or {})})
    return model, zoo.fit(model, family, train, **run), train, test


def validation_digits(name: str, size: int, data_root: str | None = None):
    """``(x, y)``: ``size`` MNIST training digits after the ``MNIST_TRAIN`` that an MNIST
    problem ``name`` fits, in the problem's input form; ``None`` for ``size`` 0."""
    import zoo

    if size == 0:
        return None
    train_set = zoo.data.mnist(data_root or os.environ.get("ZOO_DATA"), train=True,
                               download=False, limit=MNIST_TRAIN + size)  # fmt: skip
    x, y = (torch.stack(t)[MNIST_TRAIN:] for t in zip(*train_set))
    return (x.flatten(1) if name == "mlp" else x), y


def jobs(
    problems,
    families,
    data_root,
    seeds=(0,),
    grid=True,
    inits=INIT_FACTORS,
    lrs=LR_FACTORS,
    budget: int = 1,
) -> list[dict]:
    """Every fit to run: the default call at each of ``seeds``, then (``grid``) the grid at
    seed 0, per problem and family."""
    out = []
    for name in problems:
        _, _, factory, _, _ = problem(name, data_root)
        name = row_name(name, budget)
        weights = sum(math.prod(s) for s in factory().site_shapes.values())
        names = families or [*variational(), *BASELINES]
        for family in names:
            if family == "joint" and weights > JOINT_MAX:
                continue
            scales = (1.0,) if family in (*BASELINES, "map") else inits
            for seed in seeds:
                out.append({"problem": name, "family": family, "default": True, "seed": seed})
            for lr in lrs if grid else ():
                for init in scales:
                    out.append(
                        {
                            "problem": name,
                            "family": family,
                            "default": False,
                            "lr": lr,
                            "init": init,
                        }  # fmt: skip
                    )
    return out


def run_one(job: dict, data_root=None) -> dict:
    """Fit one job and score it on the problem's test set (in a worker process)."""
    torch.set_num_threads(1)
    import zoo

    name, _, times = job["problem"].partition(" x")
    train, test, factory, options, default_lr = problem(name, data_root, int(times or 1))
    family, args = job["family"], dict(options)
    args.update(seed=job.get("seed", 0), progress=False, num_samples=100)
    if job.get("kl_weight") is not None:
        args.update(loss={"kl_weight": job["kl_weight"]})
    row = job["family"]
    if not job["default"]:
        args.update(given_rate(job["problem"], family, default_lr, job["lr"]))
        if job["init"] != 1.0:
            option = INIT_OPTIONS.get(family, "init_scale")
            base = factory_guide_scale(factory, family, option)
            row = (family, family, {option: base * job["init"]})
    start = time.perf_counter()
    table, fits = zoo.compare(factory, [row], train, test, return_fits=True, **args)
    result = table.iloc[0].to_dict()
    fitted = next(iter(fits.values()))
    test_seconds = _test_seconds(fitted)
    return {
        **job,
        "seconds": time.perf_counter() - start,
        "fit_seconds": float(result["fit_seconds"]),
        "test_seconds": test_seconds,
        "nll": float(result["nll"]),
        "metric": float(result.get("accuracy", result.get("rmse", math.nan))),
        "lr_used": float(result["lr"]),
        "lr_rule": result["lr_rule"],
        "steps": int(result["steps"]),
        "statistics": _statistics(fitted),
    }


def _statistics(fitted) -> str | None:
    """``"per_draw"`` where the fit's model keeps training inputs for each draw's batch norm
    statistics (``zoo.models.per_draw``), else ``None`` (no batch norm, or one set)."""
    model = getattr(fitted, "model", None)
    return "per_draw" if getattr(model, "statistics_inputs", None) is not None else None


def _test_seconds(fitted) -> float:
    """The seconds the rate tests of a row took (its fit's, its members', its MAP fit's)."""
    members = getattr(fitted, "members", None) or [fitted]
    seconds = 0.0
    for member in members:
        options = getattr(member, "options", None)
        if isinstance(options, dict):
            seconds += float((options.get("lr_test") or {}).get("seconds", 0.0))
    return seconds


def factory_guide_scale(factory, family: str, option: str = "init_scale") -> float:
    """The default of a family's initial-spread ``option`` on the problem's model."""
    import inspect

    import guides

    cls = guides.registry.get(family)
    if option == "init_scale":
        return float(cls(factory()).init_scale)
    site = getattr(cls, "site_class", None)
    return float(inspect.signature(site.__init__).parameters[option].default)


def summarise(results: list[dict]) -> list[dict]:
    """A row per problem and family: the default call's NLL, the grid's best and its setting.

    The grid runs at seed 0, so its best is the best of several draws of the same noise (a
    winner's curse). Where the best setting was fitted again at other seeds
    (``--best-seeds``), ``mean_gap`` is the mean over the seeds both have of the default call
    less the best setting; ``gap`` stays the seed-0 difference."""
    rows = []
    keys = sorted({(r["problem"], r["family"]) for r in results}, key=_order)
    for problem_name, family in keys:
        mine = [r for r in results if (r["problem"], r["family"]) == (problem_name, family)]
        default = next((r for r in mine if r["default"] and r.get("seed", 0) == 0), None)
        if default is None:  # a grid alone (--seeds with none): nothing to set it beside
            continue
        seeds = [r["nll"] for r in mine if r["default"]]
        spread = float(torch.tensor(seeds).std()) if len(seeds) > 1 else math.nan
        grid = [r for r in mine if _in_grid(r) and math.isfinite(r["nll"])]
        best = min(grid, key=lambda r: r["nll"]) if grid else None
        defaults = [r for r in mine if r["default"]]
        rates = [r["lr_used"] for r in defaults if r.get("lr_used")]
        paired = _paired(defaults, mine, best)
        rows.append(
            {
                "problem": problem_name,
                "family": family,
                "default_lr": _geometric_mean(rates),
                "default_rule": defaults[0].get("lr_rule", ""),
                "test_share": _share(defaults),
                "default_nll": default["nll"],
                "default_metric": default["metric"],
                "best_nll": best["nll"] if best else math.nan,
                "best_lr": best["lr"] if best else math.nan,
                "best_init": best["init"] if best else math.nan,
                "gap": default["nll"] - best["nll"] if best else math.nan,
                "seed_sd": spread,
                "seeds": len(seeds),
                "paired_seeds": len(paired),
                "default_mean": _mean([d for d, _ in paired]),
                "best_mean": _mean([b for _, b in paired]),
                "mean_gap": _mean([d - b for d, b in paired]),
            }
        )
    return rows


def _in_grid(result: dict) -> bool:
    """A fit of the grid itself (seed 0), not the default call or a best setting re-seeded."""
    return not result["default"] and result.get("seed", 0) == 0


def _paired(defaults: list[dict], mine: list[dict], best: dict | None) -> list[tuple]:
    """``(default NLL, best setting's NLL)`` at each seed both were fitted at."""
    if best is None:
        return []
    at = {r.get("seed", 0): r["nll"] for r in mine
          if not r["default"] and (r["lr"], r["init"]) == (best["lr"], best["init"])}  # fmt: skip
    return [(r["nll"], at[r.get("seed", 0)]) for r in defaults if r.get("seed", 0) in at]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def best_jobs(results: list[dict], problems, families, seeds, budget: int = 1) -> list[dict]:
    """The grid's best setting of each saved (problem, family) fitted again at ``seeds``."""
    names = {row_name(name, budget) for name in problems}
    out = []
    for row in summarise(results):
        chosen = families is None or row["family"] in families
        if row["problem"] in names and chosen and math.isfinite(row["best_nll"]):
            for seed in seeds:
                setting = {"lr": row["best_lr"], "init": row["best_init"], "seed": seed}
                out.append({"problem": row["problem"], "family": row["family"], "default": False,
                            **setting})  # fmt: skip
    return out


def _order(key):
    name, _, times = key[0].partition(" x")
    return int(times or 1), (PROBLEMS + HELD_OUT).index(name), key[1]


def _geometric_mean(values: list[float]) -> float:
    values = [v for v in values if v and v > 0 and math.isfinite(v)]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else math.nan


def _share(rows: list[dict]) -> float:
    """The rate tests' share of the default calls' fit seconds."""
    fit = sum(r.get("fit_seconds", 0.0) for r in rows)
    return sum(r.get("test_seconds", 0.0) for r in rows) / fit if fit > 0 else math.nan


def within(row: dict) -> bool:
    """The issue's target: the gap at most max(0.05 nats, 2 standard deviations over seeds)."""
    sd = row["seed_sd"] if math.isfinite(row["seed_sd"]) else 0.0
    return _gap(row) <= max(0.05, 2 * sd)


def _gap(row: dict) -> float:
    """The gap the verdict reads: the mean over paired seeds where there are several (the
    grid's best fitted again at the default call's seeds), else the seed-0 gap."""
    return row["mean_gap"] if row.get("paired_seeds", 0) > 1 else row["gap"]


def _verdict(row: dict) -> str:
    """``yes`` or ``no`` (:func:`within`), ``-`` for a row without a grid."""
    if not math.isfinite(_gap(row)):
        return "-"
    return "yes" if within(row) else "no"


def table_lines(rows: list[dict]) -> list[str]:
    """The markdown table of :func:`summarise`'s rows."""
    lines = [
        "| problem | family | default lr (rule) | test's share of the fit | default NLL "
        "| sd over seeds | grid's best NLL | best lr x / init x | gap | means over seeds: "
        "default / best | mean gap | within |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        sd = f"{r['seed_sd']:.3f} ({r['seeds']})" if r.get("seeds", 1) > 1 else "-"
        rule = str(r.get("default_rule", "")).split(" (")[0]
        share = r.get("test_share", math.nan)
        share_text = f"{share:.0%}" if math.isfinite(share) and share > 0 else "-"
        paired = r.get("paired_seeds", 0)
        means = f"{r['default_mean']:.3f} / {r['best_mean']:.3f} ({paired})" if paired > 1 else "-"
        mean_gap = f"{r['mean_gap']:+.3f}" if paired > 1 else "-"
        lines.append(
            f"| {r['problem']} | {r['family']} | {r.get('default_lr', math.nan):.3g} ({rule}) | "
            f"{share_text} | {r['default_nll']:.3f} | {sd} | {r['best_nll']:.3f} | "
            f"{r['best_lr']:g} / {r['best_init']:g} | {r['gap']:+.3f} | {means} | {mean_gap} | "
            f"{_verdict(r)} |"
        )
    return lines


def accuracy_lines(results: list[dict], problem_name: str) -> list[str]:
    """The default calls' test accuracy per seed on a classification problem, and each
    family's mean below the best mean of the posterior families (the baselines, the ensemble
    and Laplace, are rows beside them but not the best they are measured against)."""
    rows = {}
    for r in results:
        if r["problem"] == problem_name and r["default"]:
            rows.setdefault(r["family"], {})[r.get("seed", 0)] = r["metric"]
    means = {f: sum(v.values()) / len(v) for f, v in rows.items()}
    best = max(m for f, m in means.items() if f not in BASELINES)
    lines = [
        "| family | accuracy at seeds "
        + ", ".join(map(str, sorted(next(iter(rows.values())))))
        + " | mean | below the best family's mean |",
        "| --- | --- | ---: | ---: |",
    ]
    for family in sorted(rows):
        seeds = ", ".join(f"{rows[family][k]:.3f}" for k in sorted(rows[family]))
        lines.append(f"| {family} | {seeds} | {means[family]:.3f} | {best - means[family]:.3f} |")
    return lines


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--problems", nargs="+", default=list(PROBLEMS), choices=PROBLEMS + HELD_OUT
    )
    parser.add_argument("--families", nargs="+", help="default: every family and baseline")
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--data-root", help="MNIST's root (default: ZOO_DATA)")
    parser.add_argument(
        "--seeds",
        nargs="*",
        type=int,
        default=[0, 1, 2],
        help="seeds of the default call (its spread is the noise of a gap); none: the grid only",
    )
    parser.add_argument("--no-grid", action="store_true", help="the default calls only")
    parser.add_argument(
        "--inits",
        nargs="+",
        type=float,
        default=list(INIT_FACTORS),
        help="factors of the default initial spread in the grid",
    )
    parser.add_argument(
        "--lrs",
        nargs="+",
        type=float,
        default=list(LR_FACTORS),
        help="factors of the default rate in the grid",
    )
    parser.add_argument(
        "--budget", type=int, default=1, help="times the short budget (epochs, or steps)"
    )
    parser.add_argument("--merge", help="a saved run whose fits this one adds to")
    parser.add_argument(
        "--extend-grid",
        action="store_true",
        help="with --merge: this run's grid settings go beside the saved grid (which a grid "
        "run otherwise replaces), e.g. rates above its edge",
    )
    parser.add_argument(
        "--best-seeds",
        nargs="+",
        type=int,
        help="instead of the default calls and grids: fit each saved row's best setting "
        "(--merge's) again at these seeds, for a gap averaged over the seeds both have",
    )
    parser.add_argument(
        "--kl-weight",
        type=float,
        help="the KL's weight in every fit of the run (default: 1, the true ELBO); with "
        "--families of the variational families",
    )
    parser.add_argument("--out", default="benchmarks/results/fairness.json")
    args = parser.parse_args(argv)
    if args.kl_weight is not None:
        tempered = [f for f in variational() if f != "map"]
        weight = args.kl_weight
        positive = weight > 0 and math.isfinite(weight)
        if not positive or not args.families or set(args.families) - set(tempered):
            parser.error(
                f"--kl-weight {args.kl_weight}: a positive weight of the KL in a variational "
                f"family's ELBO; give --families from {tempered}"
            )
    if args.best_seeds:
        if not args.merge:
            parser.error("--best-seeds reads the grids of a saved run: give --merge")
        with open(args.merge) as f:
            saved_results = json.load(f)["results"]
        todo = best_jobs(saved_results, args.problems, args.families, args.best_seeds,
                         args.budget)  # fmt: skip
    else:
        todo = jobs(
            args.problems,
            args.families,
            args.data_root,
            args.seeds,
            not args.no_grid,
            args.inits,
            args.lrs,
            args.budget,
        )
    if args.kl_weight is not None:
        todo = [{**job, "kl_weight": args.kl_weight} for job in todo]
    print(f"{len(todo)} fits on {args.processes} processes; load {os.getloadavg()}", flush=True)
    context = multiprocessing.get_context("spawn")
    with context.Pool(args.processes) as pool:
        results = []
        for r in pool.imap_unordered(_run, [(job, args.data_root) for job in todo]):
            results.append(r)
            print(
                f"  {r['problem']} {r['family']} "
                f"{'default' if r['default'] else (r['lr'], r['init'])}: NLL {r['nll']:.4f} "
                f"({r['seconds']:.0f} s)",
                flush=True,
            )
        pool.close()  # workers end on their own: terminate() would leave their semaphores
        pool.join()
    if args.merge:  # this run's default calls and grid replace the saved ones of a family
        with open(args.merge) as f:
            results = merged(json.load(f)["results"], results, args.extend_grid)
    rows = summarise(results)
    print("\n".join(table_lines(rows)))
    if any(r["problem"] == "digits" and r["default"] for r in results):
        print("\n".join(accuracy_lines(results, "digits")))
    import guides

    scales = {f: [guides.recipe(f).scale(False), guides.recipe(f).scale(True)]
              for f in variational()}  # fmt: skip
    saved = {"results": results, "rows": rows, "load": list(os.getloadavg()),
             "lr_scales": scales}  # fmt: skip
    write_json(saved, args.out)
    return saved


def merged(old: list[dict], new: list[dict], extend: bool = False) -> list[dict]:
    """``old`` results with ``new`` ones in their place: a family's grid run again replaces
    its saved grid and the best setting's re-seeded fits (the best may have moved), unless
    ``extend`` (new settings beside the saved grid); a default call, a setting or a re-seeded
    setting replaces the one of the same seed."""
    regrid = set() if extend else {(r["problem"], r["family"]) for r in new if _in_grid(r)}
    rerun = {_identity(r) for r in new}
    kept = [r for r in old
            if not (not r["default"] and (r["problem"], r["family"]) in regrid)
            and _identity(r) not in rerun]  # fmt: skip
    return kept + new


def refitted_rows(fits: list[dict], saved: list[dict]) -> list[dict]:
    """The rows of the problems and families that ``fits`` holds, with ``fits`` in place of
    ``saved``'s of the same setting and seed (:func:`merged`): default calls fitted again (on
    another machine, at another KL weight) read against the saved grids."""
    refitted = {(r["problem"], r["family"]) for r in fits}
    return [r for r in summarise(merged(saved, fits)) if (r["problem"], r["family"]) in refitted]


def _identity(r: dict) -> tuple:
    setting = None if r["default"] else (r["lr"], r["init"])
    return r["problem"], r["family"], r["default"], setting, r.get("seed", 0)


def _run(job_and_root):
    return run_one(*job_and_root)


if __name__ == "__main__":
    main()
