"""WHVI's block size: the default call of ``guides.AutoWHVI`` at each ``block_size`` (issue 69).

    python benchmarks/whvi_blocks.py                      # the table in benchmarks/README.md
    python benchmarks/whvi_blocks.py --problems digits --budget 10 --blocks none 4

On problems of ``benchmarks/fairness.py`` (the digits' 64-32-10 MLP, LeNet-5 and the ResNet-8
on 2,000 MNIST digits; ``--budget`` times their short budgets), per block size and seed, the
call ``zoo.compare`` makes with the family's options only: its rate measured, its recipe's
scale. Printed per problem and block size: the mean test NLL and accuracy over the seeds, and
the number of variational parameters (``none`` is the paper's layout, one block as wide as the
weight). The diagonal family's default call is the row beside them.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch
from saving import write_json

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

PROBLEMS = ("digits", "mnist", "resnet")
BLOCKS = ("none", "16", "8", "4")


def run(problem_name: str, budget: int, block: str, seed: int, data_root=None) -> dict:
    """One default call: WHVI at ``block`` (``"diagonal"``: the diagonal family's)."""
    from fairness import problem

    import zoo

    train, test, factory, options, _ = problem(problem_name, data_root, budget)
    if block == "diagonal":
        row: tuple = ("diagonal", "diagonal", {})
    else:
        size = None if block == "none" else int(block)
        row = (f"whvi {block}", "whvi", {"block_size": size})
    start = time.perf_counter()
    table = zoo.compare(factory, [row], train, test, seed=seed, progress=False,
                        num_samples=100, **options)  # fmt: skip
    result = table.iloc[0]
    return {
        "problem": problem_name if budget == 1 else f"{problem_name} x{budget}",
        "block": block,
        "seed": seed,
        "nll": float(result["nll"]),
        "accuracy": float(result.get("accuracy", math.nan)),
        "parameters": int(result["parameters"]),
        "lr": float(result["lr"]),
        "seconds": time.perf_counter() - start,
    }


def table_lines(results: list[dict]) -> list[str]:
    """A row per problem and block size: means over the seeds."""
    lines = [
        "| problem | block size | seeds | test NLL | accuracy | variational parameters |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    keys = dict.fromkeys((r["problem"], r["block"]) for r in results)
    for problem_name, block in keys:
        mine = [r for r in results if (r["problem"], r["block"]) == (problem_name, block)]
        nll = sum(r["nll"] for r in mine) / len(mine)
        acc = sum(r["accuracy"] for r in mine) / len(mine)
        lines.append(
            f"| {problem_name} | {block} | {len(mine)} | {nll:.3f} | {acc:.3f} | "
            f"{mine[0]['parameters']:,} |"
        )
    return lines


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problems", nargs="+", default=list(PROBLEMS), choices=PROBLEMS)
    parser.add_argument(
        "--blocks",
        nargs="+",
        default=[*BLOCKS, "diagonal"],
        help="block sizes (none: the paper's), and diagonal for the diagonal family's row",
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--budget", type=int, default=1, help="times the short budget")
    parser.add_argument("--data-root", help="MNIST's root (default: ZOO_DATA)")
    parser.add_argument("--out", default="benchmarks/results/whvi_blocks.json")
    args = parser.parse_args(argv)
    for block in args.blocks:
        if block not in ("none", "diagonal") and not block.isdigit():
            parser.error(f"--blocks takes none, diagonal or a power of two, got {block!r}")
    torch.set_num_threads(1)
    print(f"load {os.getloadavg()}", flush=True)
    results = []
    for name in args.problems:
        for block in args.blocks:
            for seed in args.seeds:
                results.append(run(name, args.budget, block, seed, args.data_root))
                r = results[-1]
                print(f"  {r['problem']} {block} seed {seed}: NLL {r['nll']:.3f} "
                      f"({r['seconds']:.0f} s)", flush=True)  # fmt: skip
    print("\n".join(table_lines(results)))
    write_json({"results": results, "load": list(os.getloadavg())}, args.out)
    return results


if __name__ == "__main__":
    main()
