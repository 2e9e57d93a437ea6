"""lightning.Trainer with zoo.lightning.BayesianModule: the thread rule on and off, side by side.

    python benchmarks/lightning_threads.py               # alone
    python benchmarks/lightning_threads.py --contended   # beside one busy process

Times ``trainer.fit`` of the 13-50-1 regression net (batch 32, ``--steps`` steps, CPU) with
``BayesianModule(threads="auto")`` (``zoo.fit``'s rule: one thread for this small network) and
with ``threads=None`` (torch's setting as it is), alternating, best of ``--rounds``.
``--contended`` runs a CPU-bound busy loop in another process meanwhile, as a shared machine has.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time
import warnings

import torch


def busy() -> None:
    while True:
        pass


def fit_seconds(threads, steps: int) -> float:
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    import zoo
    from zoo.lightning import BayesianModule

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(32 * steps, 13, generator=g), torch.randn(32 * steps, generator=g)
    model = zoo.models.BayesianMLP(13, (50,), noise=1.0)
    module = BayesianModule(model, "diagonal", len(x), example=(x, y), threads=threads)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    start = time.perf_counter()
    trainer.fit(module, DataLoader(TensorDataset(x, y), batch_size=32))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--contended", action="store_true")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    competitor = None
    if args.contended:
        competitor = multiprocessing.Process(target=busy, daemon=True)
        competitor.start()
    try:
        best = {"auto": float("inf"), None: float("inf")}
        for _ in range(args.rounds):
            for threads in best:
                best[threads] = min(best[threads], fit_seconds(threads, args.steps))
    finally:
        if competitor is not None:
            competitor.terminate()
    print(
        f"load {os.getloadavg()[0]:.2f}, torch threads {torch.get_num_threads()}, "
        f"{'contended' if args.contended else 'alone'}, {args.steps} steps"
    )
    print(f"threads='auto' (one thread): {best['auto']:.2f} s")
    print(f"threads=None (torch's {torch.get_num_threads()}): {best[None]:.2f} s")
    print(f"ratio None / auto: {best[None] / best['auto']:.2f}")


if __name__ == "__main__":
    main()
