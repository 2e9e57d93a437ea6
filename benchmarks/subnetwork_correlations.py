"""Does the subnetwork family learn the correlations of the weights it holds jointly?

    python benchmarks/subnetwork_correlations.py
    python benchmarks/subnetwork_correlations.py --train 1000 --epochs 1 --scales 10

Notebook 04's setting: a 784-32-10 ReLU MLP (prior ``N(0, 1)``, fresh initial means) on the
first 20,000 MNIST training digits, a diagonal fit of 3 epochs at ``lr=1e-3`` and batch 128, and
from it ``guides.AutoSubnetwork.from_fit(fit, size=256, select=rule)`` for both rules
(``"variance"``, ``"magnitude"``). Each subnetwork is fitted by its default call (no rate given)
and again at each ``--scales`` times the rate that call ran at, with its factor's off-diagonal
learned as the library learns it (``K N``, ``guides.joint_gaussian``) and as each other
``--factors`` (``sqrt(K) N``, ``N`` itself: the same covariances in another optimiser geometry),
and by the default call with ``--draws`` draws a step (less noise in the factor's gradients).
Beside them, a Laplace approximation over the same weights at the default call's means, through
laplace-torch (``SubnetLaplace``: the full generalised Gauss-Newton of the 256 weights, the rest
fixed, prior precision 1 as the model's prior): the correlations of the posterior the family
approximates, to second order.

Per row and per pair of sites: the mean ``|correlation|`` off the diagonal of the 256 x 256
correlation matrix (small sizes: the dense matrix is what is measured), and for the fits the
rate, what chose it and the last epoch's ``-ELBO``. For the Laplace, what its correlations are
worth: ``0.5 (sum_i log P_ii - log det P)`` nats for its precision ``P``, the KL from the best
diagonal Gaussian to it, which is what a full covariance adds to the ELBO over a diagonal one
were the posterior that Gaussian. For each fit, the pattern: Pearson's correlation between its
correlations and the Laplace's, entry by entry (the Laplace at the first factor's default call).
Results go to ``--out`` (JSON).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import time

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from saving import write_json  # noqa: E402

import guides  # noqa: E402
import guides.joint_gaussian  # noqa: E402
import zoo  # noqa: E402

#: How the joint factor's off-diagonal ``N`` is learned: the library's ``K N`` and two others
#: (``guides.joint_gaussian.lower_scale``, replaced for the fit by :func:`factor_learned_as`).
FACTOR_SCALES = {"K N": lambda k: 1.0 / k, "sqrt(K) N": lambda k: 1.0 / math.sqrt(k),
                 "N": lambda k: 1.0}  # fmt: skip


@contextlib.contextmanager
def factor_learned_as(name: str):
    """Within this block the joint family learns its factor as ``name`` (a key of
    :data:`FACTOR_SCALES`); the library's map is put back after it, whatever happens."""
    library = guides.joint_gaussian.lower_scale
    guides.joint_gaussian.lower_scale = FACTOR_SCALES[name]
    try:
        yield
    finally:
        guides.joint_gaussian.lower_scale = library


def network() -> nn.Module:
    """Notebook 04's plain network, 784-32-10 ReLU."""
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 32), nn.ReLU(), nn.Linear(32, 10))


def factory() -> zoo.models.BayesianModel:
    """Notebook 04's network as a model: untrained, the classification prior ``N(0, 1)``."""
    return zoo.models.from_module(network(), input_shape=(1, 28, 28), prior=1.0, init="fresh")


def correlation(cov: torch.Tensor) -> torch.Tensor:
    sd = cov.diagonal().sqrt()
    return cov / sd[:, None] / sd[None, :]


def block_means(corr: torch.Tensor, sites: list[str], sizes: list[int]) -> dict[str, float]:
    """The mean ``|corr|`` of each pair of sites' block (a site with itself: off the
    diagonal; a one-weight site has no such entries and is left out)."""
    edges = torch.tensor(sizes).cumsum(0).tolist()
    starts = [0, *edges[:-1]]
    out = {}
    for i, a in enumerate(sites):
        for j in range(i, len(sites)):
            block = corr[starts[i] : edges[i], starts[j] : edges[j]]
            if i == j:
                block = block[~torch.eye(len(block), dtype=torch.bool)]
            if block.numel():
                out[f"{a} x {sites[j]}"] = float(block.abs().mean())
    return out


def subnetwork_fit(
    diagonal,
    rule: str,
    train,
    epochs: int,
    lr: float | None,
    factor: str = "K N",
    draws: int = 1,
) -> dict:
    """The subnetwork of ``rule`` chosen from ``diagonal``, its factor learned as ``factor``,
    fitted (by the default call where ``lr`` is None) with ``draws`` draws a step, and its
    correlations."""
    guide = guides.AutoSubnetwork.from_fit(diagonal, size=256, select=rule)
    start = time.process_time()
    run = zoo.Run(progress=False)
    how = {"lr": lr} if lr is not None else {}
    if draws > 1:
        how["loss"] = zoo.Loss(num_particles=draws)
    with factor_learned_as(factor):
        fit = zoo.fit(guide.model, guide, train, epochs=epochs, run=run, seed=0, **how)
        sites = fit.guide.joint_sites()
        sizes = [fit.guide.site_scalars(name).numel() for name in sites]
        corr = correlation(fit.guide.joint.covariance().detach())
    fitting = fit.fitting()
    return {
        "rule": rule,
        "factor": factor,
        "row": ("default call" if lr is None else f"lr {lr:.3g}")
        + (f", {draws} draws a step" if draws > 1 else ""),
        "lr": fitting["lr"],
        "lr_rule": fitting["lr_rule"],
        "last_epoch_loss": (fit.epoch_losses or fit.losses)[-1],
        "sites": dict(zip(sites, sizes, strict=True)),
        "blocks": block_means(corr, sites, sizes),
        "cpu_seconds": time.process_time() - start,
        "fit": fit,
        "corr": corr,
    }


def pattern(corr: torch.Tensor, reference: torch.Tensor) -> float:
    """Pearson's correlation between two correlation matrices' off-diagonal entries: whether a
    fit's correlations are the reference's (1) or unrelated to them (0)."""
    off = ~torch.eye(len(corr), dtype=torch.bool)
    return float(torch.corrcoef(torch.stack([corr[off], reference[off]]))[0, 1])


def laplace_row(row: dict, train: torch.utils.data.Dataset, batch: int) -> dict:
    """laplace-torch's full-GGN Laplace over ``row``'s subnetwork at its fit's means."""
    from laplace import Laplace

    fit = row["fit"]
    net = network()
    medians = {name: value.detach() for name, value in fit.guide.median().items()}
    net.load_state_dict(medians)
    offsets, offset = {}, 0
    for name, parameter in net.named_parameters():
        offsets[name] = offset
        offset += parameter.numel()
    sites = list(row["sites"])
    indices = torch.cat([offsets[s] + fit.guide.site_scalars(s).cpu() for s in sites])
    la = Laplace(net, "classification", subset_of_weights="subnetwork",
                 hessian_structure="full", subnetwork_indices=indices.long(),
                 prior_precision=1.0)  # fmt: skip
    loader = torch.utils.data.DataLoader(train, batch_size=batch)
    start = time.process_time()
    la.fit(loader, progress_bar=False)
    precision = la.posterior_precision.double()
    corr = correlation(torch.linalg.inv(precision).float())
    # KL from the best diagonal Gaussian (precisions P_ii) to this one: the ELBO a full
    # covariance gains over a diagonal one, were the posterior this Gaussian
    worth = 0.5 * (precision.diagonal().log().sum() - torch.logdet(precision))
    return {
        "rule": row["rule"],
        "row": "Laplace (full GGN) at the default call's means",
        "sites": row["sites"],
        "corr": corr,
        "blocks": block_means(corr, sites, list(row["sites"].values())),
        "correlations_worth": float(worth),
        "cpu_seconds": time.process_time() - start,
    }


def table_lines(rows: list[dict]) -> list[str]:
    """One Markdown table: a row per fit or Laplace, a column per pair of sites."""
    pairs = list(dict.fromkeys(p for r in rows for p in r["blocks"]))
    lines = [
        "| rule | factor learned as | row | lr (rule) | -ELBO, last epoch | correlations' worth "
        "(nats) | pattern: Pearson with the Laplace | " + " | ".join(pairs) + " |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | "
        + " | ".join("---:" for _ in pairs)
        + " |",
    ]
    for r in rows:
        rate = f"{r['lr']:.3g} ({r['lr_rule'].split(' (')[0]})" if "lr" in r else "-"
        loss = f"{r['last_epoch_loss']:,.0f}" if "last_epoch_loss" in r else "-"
        worth = f"{r['correlations_worth']:.0f}" if "correlations_worth" in r else "-"
        agree = f"{r['pattern']:+.3f}" if "pattern" in r else "-"
        cells = [f"{r['blocks'][p]:.4f}" if p in r["blocks"] else "" for p in pairs]
        lines.append(
            f"| {r['rule']} | {r.get('factor', '-')} | {r['row']} | {rate} | {loss} | {worth} "
            f"| {agree} | " + " | ".join(cells) + " |"
        )
    return lines


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--train", type=int, default=20_000, help="training digits")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--scales", type=float, nargs="*", default=[10.0, 30.0],
                        help="given rates, times the default call's")  # fmt: skip
    parser.add_argument("--rules", nargs="+", default=["variance", "magnitude"],
                        choices=["variance", "magnitude"])  # fmt: skip
    parser.add_argument("--draws", type=int, default=16,
                        help="draws a step, one more default call a factor")  # fmt: skip
    parser.add_argument("--factors", nargs="+", default=list(FACTOR_SCALES),
                        choices=list(FACTOR_SCALES),
                        help="how the factor is learned (the library's: K N)")  # fmt: skip
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--data-root", default=None, help="MNIST root (default: ZOO_DATA)")
    parser.add_argument("--out", default="benchmarks/results/subnetwork_correlations.json")
    args = parser.parse_args(argv)
    if args.train < 256 or min(args.epochs, args.draws) < 1 or any(s <= 0 for s in args.scales):
        parser.error(
            "--train must be at least 256, --epochs and --draws at least 1, --scales positive"
        )
    torch.set_num_threads(args.threads)
    train = zoo.data.mnist(args.data_root, limit=args.train)  # a Dataset, as the notebook's
    run = zoo.Run(progress=False)
    diagonal = zoo.fit(factory(), guides.family("diagonal"), train, epochs=args.epochs,
                       lr=1e-3, run=run, seed=0)  # fmt: skip
    rows = []
    for rule in args.rules:
        fits = []
        for factor in args.factors:
            default = subnetwork_fit(diagonal, rule, train, args.epochs, None, factor)
            fits.append(default)
            for scale in args.scales:
                lr = scale * default["lr"]
                fits.append(subnetwork_fit(diagonal, rule, train, args.epochs, lr, factor))
            if args.draws > 1:
                fits.append(subnetwork_fit(diagonal, rule, train, args.epochs, None, factor,
                                           args.draws))  # fmt: skip
        laplace = laplace_row(fits[0], train, 128)  # at the first factor's default call
        for r in fits:
            r["pattern"] = pattern(r["corr"], laplace["corr"])
        rows += [*fits, laplace]
        print(f"  {rule}: done", file=sys.stderr, flush=True)
    print("\n".join(table_lines(rows)))
    for r in rows:
        r.pop("fit", None)
        r.pop("corr", None)
    saved = {"load": list(os.getloadavg()), "train": args.train, "epochs": args.epochs,
             "rows": rows}  # fmt: skip
    write_json(saved, args.out)
    return saved


if __name__ == "__main__":
    main()
