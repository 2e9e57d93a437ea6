"""Is a Bayesian fit from scratch at least as good as the point estimate? Every family's
default call against the zoo's ``"map"`` default call of the same budget and a plain PyTorch
loop (issue 93).

    python benchmarks/against_map.py                      # every problem, family, seed
    python benchmarks/against_map.py --problems digits resnet --families diagonal --seeds 0

Problems (at their budget and, with ``--budgets 1 10``, ten times it):

- ``digits``: scikit-learn's 8x8 digits, 64-32-10 ReLU MLP, 10 epochs;
- ``cnn``: 2,000 MNIST digits, a batch-norm CNN converted fresh (``from_module``), 5 epochs;
- ``mnist``: the same digits, LeNet-5, 5 epochs;
- ``resnet``: the same digits, ResNet-8 (batch norm), 5 epochs;
- ``resnet10k``: ResNet-8 on 10,000 MNIST digits, 3 epochs;
- ``transformer``, ``lstm``: 2,000 MNIST digits read as sequences of 28 rows, an
  ``nn.TransformerEncoder`` and an ``nn.LSTM`` classifier converted fresh, 5 epochs.

Each row: test accuracy, NLL, ECE (15 bins), OOD AUROC (the test digits rotated 90 degrees,
predictive entropy as the score), mean mutual information on the test and on the rotated
inputs, seconds (CPU time of the fit), and the fit's ``recipe``. The targets (issue 93): accuracy
at least MAP's minus 0.5 point, NLL at most MAP's, ECE at most MAP's plus 0.01, OOD AUROC at
least MAP's, a ten-times row's NLL no worse than its one-time row's (+0.01), and mutual
information higher out of distribution than in it. The table prints each row's gaps against
MAP's row of the same problem, budget and seed, and which targets it meets.

Fits run in ``--processes`` worker processes of one thread each. The table and the rows go to
``--out`` (``benchmarks/suite.py``'s result), merged with the rows it held: a run of some
problems or families replaces those rows and keeps the others, and the result lists every
command it holds.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import suite  # noqa: E402

PROBLEMS = ("digits", "cnn", "mnist", "resnet", "resnet10k", "transformer", "lstm")
FAMILIES = ("diagonal", "lowrank", "matrix_normal", "block_diagonal", "tridiagonal", "whvi",
            "mc_dropout")  # fmt: skip
SAMPLES = 32
PLAIN_LR = 1e-3
MNIST_TRAIN = 2000


def _sequence_net(kind: str) -> torch.nn.Module:
    from torch import nn

    class Rows(nn.Module):
        """An image's 28 rows as a sequence: a linear embedding, then the body, then a head."""

        def __init__(self):
            super().__init__()
            self.embed = nn.Linear(28, 32)
            if kind == "transformer":
                layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
                self.body = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
            else:
                self.body = nn.LSTM(32, 32, batch_first=True)
            self.head = nn.Linear(32, 10)

        def forward(self, x):
            h = self.body(self.embed(x.reshape(len(x), 28, 28)))
            h = h[0] if isinstance(h, tuple) else h
            return self.head(h.mean(1))

    return Rows()


def _cnn() -> torch.nn.Module:
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 10),
    )  # fmt: skip


def _factory(name: str):
    import zoo

    if name == "mnist":
        return zoo.models.LeNet5
    if name == "cnn":
        return lambda: zoo.models.from_module(_cnn(), init="fresh")
    if name in ("resnet", "resnet10k"):  # batch norm's running statistics in the model
        return lambda: zoo.models.ResNet(8, in_channels=1, input_size=28)
    return lambda: zoo.models.from_module(_sequence_net(name), init="fresh")


def problem(name: str, budget: int, root: str | None):
    """``(train, test, model_factory, fit_options)`` of a problem at ``budget`` times its
    length; the plain loop trains the built model's own network (``model.net``)."""
    import zoo

    if name == "digits":
        from reference import load

        train, test, _, _ = load("digits")
        factory = lambda: zoo.models.BayesianMLP(64, (32,), 10, task="classification")  # noqa: E731
        return train, test, factory, {"epochs": 10 * budget, "batch_size": 128}
    size = 10_000 if name == "resnet10k" else MNIST_TRAIN
    train_set = zoo.data.mnist(root, train=True, download=False, limit=size)
    test_size = 1000 if name == "resnet" else 2000
    test_set = zoo.data.mnist(root, train=False, download=False, limit=test_size)
    train = tuple(torch.stack(t) for t in zip(*train_set))
    test = tuple(torch.stack(t) for t in zip(*test_set))
    epochs = 3 if name == "resnet10k" else 5
    return train, test, _factory(name), {"epochs": epochs * budget, "batch_size": 128}


def rotated(x: torch.Tensor) -> torch.Tensor:
    """The out-of-distribution inputs: each image turned 90 degrees (an 8x8 digit flattened
    to 64 features is turned as its image)."""
    if x.dim() == 2:
        side = int(x.shape[1] ** 0.5)
        return torch.rot90(x.reshape(-1, side, side), 1, (1, 2)).reshape(len(x), -1)
    return torch.rot90(x, 1, (-2, -1))


def scores(predict, test) -> dict:
    """The row's metrics from ``predict(x) -> ClassificationPrediction``."""
    import zoo

    x, y = test
    inside, outside = predict(x), predict(rotated(x))
    probs = inside.probs
    return {
        "accuracy": zoo.metrics.accuracy(probs, y),
        "nll": zoo.metrics.nll(probs, y),
        "ece": zoo.metrics.ece(probs, y),
        "ood_auroc": zoo.metrics.ood_auroc(inside.entropy, outside.entropy),
        "mi_test": float(inside.mutual_information.mean()),
        "mi_ood": float(outside.mutual_information.mean()),
    }


def plain_loop(job: dict, train, test, model, options) -> dict:
    """The network trained by Adam on cross-entropy alone (no prior), as a user's loop does."""
    import torch.nn.functional as F

    from zoo.models.predictions import ClassificationPrediction

    net = model.net
    for p in net.parameters():
        p.requires_grad_(True)
    opt = torch.optim.Adam(net.parameters(), lr=PLAIN_LR)
    g = torch.Generator().manual_seed(job["seed"])
    x, y = train
    net.train()
    for _ in range(options["epochs"]):
        for idx in torch.randperm(len(x), generator=g).split(options["batch_size"]):
            opt.zero_grad()
            F.cross_entropy(net(x[idx]), y[idx]).backward()
            opt.step()
    net.eval()

    def predict(inputs):
        with torch.no_grad():
            logits = torch.cat([net(part) for part in inputs.split(500)])[None]
        return ClassificationPrediction(logits, sample_probs=logits.softmax(-1))

    return scores(predict, test)


def run_one(job: dict) -> dict:
    """One row: a fit (or the plain loop) of ``job["family"]`` and its scores."""
    import zoo

    torch.set_num_threads(1)
    torch.manual_seed(job["seed"])
    train, test, factory, options = problem(job["problem"], job["budget"], job["root"])
    model = factory()
    start = time.process_time()
    row = {k: job[k] for k in ("problem", "budget", "family", "seed")}
    if job["family"] == "plain":
        row.update(plain_loop(job, train, test, model, options), recipe="plain Adam loop")
    else:
        fit = zoo.fit(model, job["family"], train, seed=job["seed"], **options,
                      run={"progress": False})  # fmt: skip
        row.update(scores(lambda x: fit.predict(x, num_samples=SAMPLES, seed=0,
                                                progress=False), test))  # fmt: skip
        row["recipe"] = fit.options["recipe"]
    row["seconds"] = time.process_time() - start
    print(f"  {row['problem']} x{row['budget']} {row['family']} seed {row['seed']}: "
          f"NLL {row['nll']:.3f}, {row['seconds']:.0f} s", file=sys.stderr, flush=True)  # fmt: skip
    return row


def verdicts(row: dict, point: dict, once: dict | None) -> list[str]:
    """The targets ``row`` misses against MAP's ``point`` (and its one-time row ``once``)."""
    missed = []
    if row["accuracy"] < point["accuracy"] - 0.005:
        missed.append("accuracy")
    if row["nll"] > point["nll"]:
        missed.append("NLL")
    if row["ece"] > point["ece"] + 0.01:
        missed.append("ECE")
    if row["ood_auroc"] < point["ood_auroc"]:
        missed.append("AUROC")
    if once is not None and row["nll"] > once["nll"] + 0.01:
        missed.append("longer is worse")
    if row["family"] not in ("map", "plain") and not row["mi_ood"] > row["mi_test"]:
        missed.append("MI")
    return missed


def table_lines(rows: list[dict]) -> list[str]:
    """The README's table: a row per fit, its gaps against MAP's row and what it misses."""
    key = lambda r: (r["problem"], r["budget"], r["seed"])  # noqa: E731
    maps = {key(r): r for r in rows if r["family"] == "map"}
    lines = [
        "| problem | family | seed | accuracy | NLL | ECE | OOD AUROC | MI test / OOD | "
        "seconds | NLL - MAP's | misses |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        point = maps.get(key(r))
        once = next((o for o in rows if o["budget"] == 1 and o["family"] == r["family"]
                     and o["problem"] == r["problem"] and o["seed"] == r["seed"]
                     and r["budget"] > 1), None)  # fmt: skip
        gap = f"{r['nll'] - point['nll']:+.3f}" if point else "-"
        missed = ", ".join(verdicts(r, point, once)) or "none" if point else "-"
        name = r["problem"] + (f" x{r['budget']}" if r["budget"] > 1 else "")
        lines.append(
            f"| {name} | {r['family']} | {r['seed']} | {r['accuracy']:.3f} | {r['nll']:.3f} | "
            f"{r['ece']:.3f} | {r['ood_auroc']:.3f} | {r['mi_test']:.4f} / {r['mi_ood']:.4f} | "
            f"{r['seconds']:.0f} | {gap} | {missed} |"
        )
    return lines


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--problems", nargs="+", default=list(PROBLEMS), choices=PROBLEMS)
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    parser.add_argument("--budgets", nargs="+", type=int, default=[1, 10])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--no-plain", action="store_true", help="leave the plain loop out")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--data-root", default=os.environ.get("ZOO_DATA"))
    parser.add_argument("--out", default=None, help="default: benchmarks/results/against_map.json")
    args = parser.parse_args(argv)
    baselines = ["map"] + ([] if args.no_plain else ["plain"])
    jobs = [
        {"problem": p, "budget": b, "family": f, "seed": s, "root": args.data_root}
        for p in args.problems
        for b in (args.budgets if p != "resnet10k" else [1])
        for s in args.seeds
        for f in baselines + list(args.families)
    ]
    saved = suite.load("against_map", out=args.out)
    with suite.record("against_map", args.out, argv) as run:
        context = multiprocessing.get_context("spawn")  # a fresh interpreter and lock per fit
        with context.Pool(args.processes, maxtasksperchild=1) as pool:
            rows = pool.map(run_one, jobs, chunksize=1)
            pool.close()  # workers end on their own: terminate() would leave their semaphores
            pool.join()
        rows = merged(saved["data"]["rows"] if saved else [], rows)
        print("\n".join(table_lines(rows)))
        run.data, run.earlier = {"rows": rows}, suite.commands(saved)
    return rows


def _identity(row: dict) -> tuple:
    return row["problem"], row["budget"], row["family"], row["seed"]


def merged(old: list[dict], new: list[dict]) -> list[dict]:
    """``old``'s rows that ``new`` does not run again, then ``new``'s, in the grid's order."""
    ran = {_identity(r) for r in new}
    rows = [r for r in old if _identity(r) not in ran] + new
    order = {name: i for i, name in enumerate(PROBLEMS)}
    return sorted(rows, key=lambda r: (order[r["problem"]], r["budget"], r["seed"]))


if __name__ == "__main__":
    main()
