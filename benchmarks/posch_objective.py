"""Why the Posch tridiagonal predicts badly on the ResNet-8: its objective, not its rate.

    python benchmarks/posch_objective.py                         # ResNet-8, 80 steps
    python benchmarks/posch_objective.py --kl-weights 1 0.01 --scales 10

``benchmarks/fairness.py`` finds the Posch tridiagonal's default call on the ResNet-8 far
behind every other family and behind its grid's best. Its parameterisation ties each weight's
variance to its mean, ``Var[w_i] = tau^2 m_i^2`` with one ``tau`` per layer, so the KL to the
``N(0, 1)`` prior holds ``-n log tau - sum_i log |m_i|`` per layer of ``n`` weights. Two tables:

- **At the start** (the guide's initial state, one draw on the first minibatch): per layer, the
  median ``|m|``, the median size of the gradient of the data term (full-data scale,
  ``zoo.inference.elbo``) and of the KL with respect to the means, and the share of means
  whose KL gradient is the larger.
- **After a fit** (``fairness.fit_once``, seed 0): the default call, then each ``--scales`` of
  the grid's rates, each at every ``--kl-weights`` (1 is the true ELBO; Posch & Pilz weight
  the KL by 1/100 and 1/10): the rate, the last epoch's mean ``-ELBO`` (of the objective that
  fit minimised), the test accuracy and NLL, the mean ``tau`` over the layers (it starts at
  ``init_tau``, 0.1) and the median ``|m|`` over all means, against its start.

Results go to ``--out`` (JSON).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import pyro
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fairness  # noqa: E402
from saving import write_json  # noqa: E402

import guides  # noqa: E402
from zoo.inference.elbo import ElboScale  # noqa: E402


def _locs(guide) -> dict[str, torch.Tensor]:
    """Each weight site's mean (the ``loc`` parameter of its Posch site)."""
    return {name: guide.site_posterior(name).loc for name in guide.site_names}


def start_rows(factory, train, batch: int) -> tuple[list[dict], float]:
    """Per layer at the guide's initial state: the data term's and the KL's gradient on the
    means, for one draw on the first ``batch`` examples, the data term scaled to all of them;
    and the median ``|m|`` over all means."""
    pyro.set_rng_seed(0)
    model = factory()
    x, y = train[0][:batch], train[1][:batch]
    guide = guides.AutoTridiagonal(model)
    guide(x, y)  # creates the parameters
    locs = _locs(guide)
    with ElboScale(data_scale=len(train[0]) / batch):
        guide_trace = pyro.poutine.trace(guide).get_trace(x, y)
        replayed = pyro.poutine.replay(model, trace=guide_trace)
        model_trace = pyro.poutine.trace(replayed).get_trace(x, y)
    model_trace.compute_log_prob()
    guide_trace.compute_log_prob()
    data, kl = 0.0, 0.0
    for name, site in model_trace.nodes.items():
        if site["type"] != "sample":
            continue
        if site["is_observed"]:
            data = data - site["log_prob_sum"]
        elif name in guide_trace.nodes:
            kl = kl + guide_trace.nodes[name]["log_prob_sum"] - site["log_prob_sum"]
    tensors = list(locs.values())
    data_grads = torch.autograd.grad(data, tensors, retain_graph=True, allow_unused=True)
    kl_grads = torch.autograd.grad(kl, tensors, allow_unused=True)
    rows = []
    for (name, m), gd, gk in zip(locs.items(), data_grads, kl_grads, strict=True):
        gd = torch.zeros_like(m) if gd is None else gd
        rows.append({
            "layer": name,
            "weights": m.numel(),
            "median_abs_mean": float(m.detach().abs().median()),
            "median_data_grad": float(gd.abs().median()),
            "median_kl_grad": float(gk.abs().median()),
            "kl_larger": int((gk.abs() > gd.abs()).sum()),
        })  # fmt: skip
    return rows, float(torch.cat([m.detach().flatten() for m in tensors]).abs().median())


def fit_row(loaded, scale: float | None, kl_weight: float, samples: int) -> dict:
    """One fit of the Posch tridiagonal at the default call (``scale=None``) or at the grid's
    rate ``scale``, its KL weighted by ``kl_weight``."""
    start = time.perf_counter()
    extra = {"kl_weight": kl_weight} if kl_weight != 1 else None
    _, fit, _, test = fairness.fit_once("resnet", "tridiagonal", 1, scale, extra=extra,
                                        loaded=loaded)  # fmt: skip
    metrics = fit.evaluate(test, num_samples=samples, progress=False)
    sites = [fit.guide.site_posterior(name) for name in fit.guide.site_names]
    taus = [float(site.tau.detach()) for site in sites]
    means = torch.cat([site.loc.detach().flatten() for site in sites])
    epochs = fit.epoch_losses or fit.losses
    print(f"  {scale or 'default'}, kl {kl_weight:g}: {time.perf_counter() - start:.0f} s",
          file=sys.stderr)  # fmt: skip
    return {
        "rate": "default" if scale is None else f"x {scale:g}",
        "kl_weight": kl_weight,
        "lr": fit.fitting()["lr"],
        "last_epoch_loss": epochs[-1],
        "test_accuracy": float(metrics["accuracy"]),
        "test_nll": float(metrics["nll"]),
        "mean_tau": sum(taus) / len(taus),
        "median_abs_mean": float(means.abs().median()),
    }


def table_lines(start: list[dict], fits: list[dict], initial_median: float) -> list[str]:
    """The two tables in Markdown."""
    lines = [
        "| layer | weights | median abs(m) | median abs(d data / dm) | median abs(d KL / dm) "
        "| KL's the larger |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in start:
        lines.append(
            f"| {r['layer']} | {r['weights']:,} | {r['median_abs_mean']:.3f} "
            f"| {r['median_data_grad']:.3g} | {r['median_kl_grad']:.3g} "
            f"| {r['kl_larger'] / r['weights']:.0%} |"
        )
    total = sum(r["weights"] for r in start)
    larger = sum(r["kl_larger"] for r in start)
    lines += [f"| all | {total:,} | | | | {larger / total:.0%} |", ""]
    lines += [
        "| rate | KL weight | lr | -ELBO, last epoch | test accuracy / NLL | mean tau "
        "| median abs(m) (start) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in fits:
        lines.append(
            f"| {r['rate']} | {r['kl_weight']:g} | {r['lr']:.3g} | {r['last_epoch_loss']:,.0f} "
            f"| {r['test_accuracy']:.3f} / {r['test_nll']:.3f} | {r['mean_tau']:.3f} "
            f"| {r['median_abs_mean']:.3f} ({initial_median:.3f}) |"
        )
    return lines


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kl-weights", type=float, nargs="+", default=[1.0, 0.1, 0.01])
    parser.add_argument("--scales", type=float, nargs="*", default=[10.0],
                        help="given rates beside the default call's, times the task's")  # fmt: skip
    parser.add_argument("--samples", type=int, default=30, help="draws per prediction")
    parser.add_argument("--epochs", type=int, default=None, help="(default: the problem's 5)")
    parser.add_argument("--train", type=int, default=None, help="training digits (default: all)")
    parser.add_argument("--test", type=int, default=None, help="test digits (default: all)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--data-root", default=None, help="MNIST root (default: ZOO_DATA)")
    parser.add_argument("--out", default="benchmarks/results/posch_objective.json")
    args = parser.parse_args(argv)
    if args.samples < 1 or any(not 0 < w <= 1 for w in args.kl_weights):
        parser.error("--samples must be at least 1 and every --kl-weights in (0, 1]")
    sizes = (args.epochs, args.train, args.test)
    if any(s <= 0 for s in args.scales) or any(n is not None and n < 1 for n in sizes):
        parser.error("--scales must be positive, --epochs, --train and --test at least 1")
    torch.set_num_threads(args.threads)
    train, test, factory, options, lr = fairness.problem("resnet", args.data_root)
    options = {**options, "epochs": args.epochs or options["epochs"]}
    train = tuple(t[: args.train] for t in train) if args.train else train
    test = tuple(t[: args.test] for t in test) if args.test else test
    loaded = (train, test, factory, options, lr)
    start, initial = start_rows(factory, train, options["batch_size"])
    fits = [
        fit_row(loaded, scale, weight, args.samples)
        for scale in (None, *args.scales)
        for weight in args.kl_weights
    ]
    print("\n".join(table_lines(start, fits, initial)))
    saved = {"load": list(os.getloadavg()), "epochs": options["epochs"], "start": start,
             "initial_median_abs_mean": initial, "fits": fits}  # fmt: skip
    write_json(saved, args.out)
    return saved


if __name__ == "__main__":
    main()
