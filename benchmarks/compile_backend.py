"""``torch.compile`` over the zoo's loss, beside the eager and the traced backends: when it pays.

    python benchmarks/compile_backend.py                   # the tiny net, diagonal, CPU
    python benchmarks/compile_backend.py --family lowrank --backend aot_eager
    python benchmarks/compile_backend.py --device cuda --net lenet5

The loss is the objective's eager backend (``zoo.inference.backends.EagerLoss``: Pyro's traces
and the reduced ELBO, as Python). For it this prints what ``torch._dynamo.explain`` finds (the
graphs the loss splits into and the breaks between them, with the first reasons), the wall time
of ``torch.compile``'s first loss and backward (the compilation, ``--backend``), and the median
loss-and-backward time of the eager backend, the traced backend (``jit=True``) and the compiled
function, over ``--steps`` steps after a warm-up, in one process, alternating in ``--rounds``
rounds. A ``torch.compile`` backend would replace the traced one (one more
``zoo.inference.backends.LossBackend``) the day its graphs are one and its step beats the traced
one; a failed compilation is printed as the row's result.

Nets: ``tiny`` the 13-50-1 regression MLP on a batch of 32, ``mlp`` 1-50-1 (the net of the
issue's ``explain`` count), ``lenet5`` on a batch of 128.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings

import torch

import guides
import zoo

NETS = ("tiny", "mlp", "lenet5")


def problem(net: str, device: torch.device):
    """``(model, x, y)`` of a net, seeded."""
    g = torch.Generator().manual_seed(0)
    if net == "lenet5":
        model = zoo.models.LeNet5()
        x, y = torch.randn(128, 1, 28, 28, generator=g), torch.randint(0, 10, (128,), generator=g)
    else:
        inputs = 13 if net == "tiny" else 1
        model = zoo.models.BayesianMLP(inputs, (50,), noise=1.0)
        x, y = torch.randn(32, inputs, generator=g), torch.randn(32, generator=g)
    return model.to(device), x.to(device), y.to(device)


def objective(net: str, family: str, device: torch.device, jit: bool):
    model, x, y = problem(net, device)
    built = zoo.Objective(model, guides.get(family)(model), jit=jit)
    built.setup(x, y)
    return built, x, y


def timed(step, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def pass_of(loss_fn, params) -> callable:
    """One loss and backward, the gradients cleared first."""

    def step():
        for p in params:
            p.grad = None
        loss_fn().backward()

    return step


def explain(loss_fn) -> tuple[int, int, list[str]]:
    """``(graphs, breaks, first reasons)`` of ``torch._dynamo.explain`` over ``loss_fn``."""
    import torch._dynamo

    torch._dynamo.reset()
    found = torch._dynamo.explain(loss_fn)()
    reasons = [str(getattr(b, "reason", b)).splitlines()[0] for b in found.break_reasons[:3]]
    return found.graph_count, found.graph_break_count, reasons


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--net", default="tiny", choices=NETS)
    parser.add_argument("--family", default="diagonal", choices=sorted(guides.available()))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--backend", default="inductor", help="torch.compile's backend")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    print(f"load: {os.getloadavg()[0]:.2f} (1 min average); torch {torch.__version__}")
    eager, x, y = objective(args.net, args.family, device, jit=False)
    traced, _, _ = objective(args.net, args.family, device, jit=True)
    warnings.simplefilter("ignore")  # dynamo's notes on every break
    graphs, breaks, reasons = explain(lambda: eager.loss(x, y, 60_000))
    print(f"torch._dynamo.explain: {graphs} graphs, {breaks} graph breaks")
    for reason in reasons:
        print(f"  break: {reason[:160]}")
    compiled_fn = torch.compile(lambda: eager.loss(x, y, 60_000), backend=args.backend)
    params = eager.eager.params
    steps = {
        "eager": pass_of(lambda: eager.loss(x, y, 60_000), params),
        "traced (jit=True)": pass_of(lambda: traced.loss(x, y, 60_000), traced.backend.params),
        f"torch.compile ({args.backend})": pass_of(compiled_fn, params),
    }
    row: dict = {"graphs": graphs, "breaks": breaks}
    try:
        row["compile_s"] = timed(steps[f"torch.compile ({args.backend})"], device)
    except Exception as err:  # noqa: BLE001 (the result of the row)
        row["compile_s"] = f"failed: {type(err).__name__}: {str(err).splitlines()[0][:120]}"
        del steps[f"torch.compile ({args.backend})"]
    print(f"first compiled loss and backward: {row['compile_s']}")
    for step in steps.values():  # warm-up: graphs built, executors profiled
        for _ in range(5):
            step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.rounds):
        for name, step in steps.items():
            times[name] += [timed(step, device) for _ in range(args.steps)]
    base = statistics.median(times["eager"])
    print("| loss | median ms per loss and backward | / eager |\n| --- | ---: | ---: |")
    for name, values in times.items():
        median = statistics.median(values)
        row[name] = median
        print(f"| {name} | {median * 1e3:.3f} | {median / base:.2f} |")
    print(f"load: {os.getloadavg()[0]:.2f} (1 min average)")
    return row


if __name__ == "__main__":
    main()
