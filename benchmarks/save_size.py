"""Bytes of a saved LeNet-5 fit against the bytes of its variational parameters, per family.

    python benchmarks/save_size.py

A fit is saved as plain data (``FitResult.save``): the guide's spec and state dict, the model's
spec and buffers, and the history. Two steps on random images suffice: sizes depend on shapes.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

import guides
import zoo


def main() -> None:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 1, 28, 28, generator=g), torch.randint(0, 10, (8,), generator=g)
    print("| family | file bytes | parameter bytes | ratio |")
    print("| --- | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as folder:
        for family in guides.available():
            fit = zoo.fit(
                zoo.models.LeNet5(),
                family,
                (x, y),
                num_steps=2,
                run=zoo.Run(progress=False),
            )
            path = fit.save(Path(folder) / f"{family}.pt")
            params = sum(p.numel() * p.element_size() for p in fit.guide.parameters())
            size = path.stat().st_size
            print(f"| {family} | {size:,} | {params:,} | {size / params:.3f} |")


if __name__ == "__main__":
    main()
