"""Which weights should a subnetwork hold? The choices of ``guides.AutoSubnetwork`` against the
HMC reference on the three sets of ``benchmarks/reference.py`` (issue 49).

Daxberger et al. (ICML 2021) choose the ``S`` weights of largest marginal variance under a
fitted diagonal posterior and start the full-covariance Gaussian from a MAP solution. Here, on
each set, the diagonal family is fitted as ``zoo.compare`` fits it (same data, seed and recipe),
then three subnetworks of ``S = 256`` are fitted with that recipe: chosen by the largest initial
magnitude (the family's default, from a fresh start), and through
``AutoSubnetwork.from_fit(diagonal_fit, 256, select=...)`` by the largest fitted variance (the
paper's rule) and by the largest fitted magnitude, both starting from the diagonal fit's means.
Each row's predictive is compared with the reference's (``zoo.evaluation.agreement``). The
chains are read back from ``benchmarks/reference.py``'s checkpoints (``--workdir``), which must
have been sampled with the same ``--chains --warmup --draws``.

Run: ``python benchmarks/subnetwork_selection.py --out
benchmarks/results/subnetwork_selection.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from reference import load, save_each  # noqa: E402

import guides  # noqa: E402
import zoo  # noqa: E402
from zoo.evaluation.agreement import distances  # noqa: E402
from zoo.training.options import grouped  # noqa: E402

#: set -> draws per chain of its stored reference (benchmarks/README.md's commands).
DRAWS = {"diabetes": 400, "moons": 400, "digits": 800}
SIZE = 256


def run(name: str, args) -> dict:
    train, test, factory, options = load(name, args.seed)
    ref = zoo.reference(
        factory(),
        train,
        chains=4,
        warmup=400,
        draws=DRAWS[name],
        seed=args.seed,
        sampler=zoo.NUTS(max_tree_depth=8),
        checkpoint=Path(args.workdir) / name,
        progress=False,
    )
    ref_pred = ref.predict(test[0], progress=False)
    fit_options = {**grouped(options), "seed": args.seed, "run": zoo.Run(progress=False)}
    diagonal = zoo.fit(factory(), "diagonal", train, **fit_options)
    rows = {"diagonal": diagonal}
    rows["subnetwork, magnitude at the start"] = zoo.fit(
        factory(), guides.family("subnetwork", size=SIZE), train, **fit_options
    )
    for rule in ("variance", "magnitude"):
        guide = guides.AutoSubnetwork.from_fit(diagonal, size=SIZE, select=rule)
        start = time.perf_counter()
        fit = zoo.fit(guide.model, guide, train, **fit_options)
        rows[f"subnetwork from_fit, {rule}"] = fit
        print(f"   {name} from_fit {rule}: {time.perf_counter() - start:.1f} s")
    table = {}
    for label, fit in rows.items():
        pred = fit.predict(test[0], num_samples=100, progress=False)
        metrics = fit.model.likelihood.metrics(pred, test[1])
        layers = {}
        if "subnetwork" in label:  # how many chosen weights each site holds
            layers = {s: fit.guide.site_scalars(s).numel() for s in fit.guide.joint_sites()}
        table[label] = {
            **{k: float(v) for k, v in metrics.items()},
            **distances(pred, ref_pred),
            "chosen_per_site": layers,
        }
        print(f"   {name} {label}: {table[label]}")
    return table


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", nargs="+", default=list(DRAWS), choices=list(DRAWS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", default="benchmarks/results/reference-chains")
    parser.add_argument("--out", default="benchmarks/results/subnetwork_selection.json")
    args = parser.parse_args(argv)
    save_each(args.datasets, lambda name: run(name, args), args.out)


if __name__ == "__main__":
    main()
