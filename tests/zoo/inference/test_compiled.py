"""The compiled loss (zoo.inference.compiled) against the eager one: same value and gradients for
the same draws, for every family of the registry, both ELBOs and every estimator; and what it
refuses."""

import math
import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch

import guides
import zoo
import zoo.inference.compiled
import zoo.priors
from tests.families import CASES, PRIMARY
from zoo.models import BayesianMLP
from zoo.priors import NormalPrior


def data(n=20, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, generator=g), torch.randn(n, 2, generator=g)


def objectives(family, options=None, *, model=None, **objective_options):
    """An eager and a compiled objective of one model and guide (set up on the data)."""
    model = model or BayesianMLP(3, (6,), 2, task="regression")
    x, y = data()
    guide = guides.get(family)(model, **(options or {}))
    eager = zoo.Objective(model, guide, jit=False, **objective_options)
    compiled = zoo.Objective(model, guide, jit=True, **objective_options)
    eager.setup(x, y)
    compiled.setup(x, y)
    return eager, compiled, [p for p in guide.parameters()] + list(model.parameters())


def assert_same(eager, compiled, params, x, y, num_data=100, steps=(0, 5)):
    params = [p for p in params if p.requires_grad]
    for seed, step in zip((1, 2), steps):
        pyro.set_rng_seed(seed)
        a = eager.loss(x, y, num_data, step=step)
        grads_a = torch.autograd.grad(a, params)
        pyro.set_rng_seed(seed)
        b = compiled.loss(x, y, num_data, step=step)
        grads_b = torch.autograd.grad(b, params)
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-4)
        for ga, gb in zip(grads_a, grads_b):
            torch.testing.assert_close(gb, ga, rtol=1e-4, atol=1e-4)
    assert compiled.jit_state == "compiled"


@pytest.mark.parametrize("elbo", ["trace", "meanfield"])
@pytest.mark.parametrize("case", list(CASES))
def test_compiled_loss_equals_the_eager_one(case, elbo):
    family, options = CASES[case]
    eager, compiled, params = objectives(family, options, elbo=elbo)
    assert_same(eager, compiled, params, *data())


@pytest.mark.parametrize("prior", ["learned", "hierarchical"])
def test_learned_prior_scales_are_graph_inputs(prior):
    """The learned scale is a model parameter (its gradient flows through the graph) and the
    hierarchical one a latent site of its own."""
    model = BayesianMLP(3, (6,), 2, task="regression", prior=prior)
    eager, compiled, params = objectives("diagonal", model=model)
    assert_same(eager, compiled, params, *data())


@pytest.mark.parametrize(
    "family, estimator",
    [("diagonal", "local"), ("diagonal", "flipout"), ("matrix_normal", "local"),
     ("mc_dropout", "local")],
)  # fmt: skip
def test_compiled_estimators_equal_the_eager_ones(family, estimator):
    eager, compiled, params = objectives(family, estimator=estimator)
    assert_same(eager, compiled, params, *data())


def test_one_graph_serves_every_kl_weight_and_the_last_batch_runs_eagerly():
    """The KL weight and N / B are graph inputs: an annealing schedule compiles once; a batch
    smaller than the minibatch size (the last of an epoch) is evaluated eagerly, with no graph
    of its own; a batch of another shape that is not smaller compiles a second graph."""
    eager, compiled, params = objectives("diagonal", kl_weight=lambda step: 0.1 * (step + 1))
    x, y = data()
    assert compiled.minibatch_size == len(x)
    assert_same(eager, compiled, params, x, y, steps=(0, 7))
    assert len(compiled.backend.graphs) == 1
    assert_same(eager, compiled, params, x[:7], y[:7], num_data=20)
    assert len(compiled.backend.graphs) == 1
    assert_same(eager, compiled, params, torch.cat([x, x]), torch.cat([y, y]), num_data=40)
    assert len(compiled.backend.graphs) == 2


def test_the_first_step_and_validation_run_eagerly():
    eager, compiled, params = objectives("diagonal")
    x, y = data()
    compiled.loss(x, y, 20, validate=True)
    assert compiled.backend.graphs == {}


def test_jit_true_refuses_what_it_cannot_compile_and_auto_falls_back():
    def model(x, y=None):
        w = pyro.sample("w", dist.Normal(torch.zeros(3), 1.0).to_event(1))
        with pyro.plate("data", len(x)):
            pyro.sample("obs", dist.Normal(x @ w, 1.0), obs=y)

    x, y = torch.randn(10, 3), torch.randn(10)
    guide = guides.get("diagonal")(model)
    with pytest.raises(ValueError, match="jit=True cannot compile this loss: the model is not"):
        zoo.Objective(model, guide, jit=True).setup(x, y)
    auto = zoo.Objective(model, guide)
    auto.loss(x, y, 10)
    assert auto.jit_state == "eager (the model is not a zoo.models.BayesianModel)"
    model = BayesianMLP(3, (4,), 2, task="regression")
    fit = zoo.fit(
        model,
        "diagonal",
        data(),
        num_steps=2,
        loss=zoo.Loss(num_particles=2),
        run=zoo.Run(progress=False),
    )
    assert fit.options["jit"] == "eager (num_particles > 1 (vectorised particles use " \
        "torch.func.vmap))"  # fmt: skip


class ValueDependentPrior(NormalPrior):
    """A prior whose Python reads a sampled value: a graph would freeze that number."""

    def sample_latent(self):
        return {"z": pyro.sample("z", dist.Normal(0.0, 1.0))}

    def site_distribution(self, name, shape, fan_in, latent):
        scale = 1.0 + abs(float(latent["z"].detach()))  # a Python number: frozen by a trace
        return NormalPrior(scale).distribution(shape, fan_in)


def test_a_graph_that_freezes_a_value_is_refused_with_a_warning():
    model = BayesianMLP(3, (6,), 2, task="regression", prior=ValueDependentPrior())
    x, y = data()
    with pytest.warns(
        RuntimeWarning,
        match=r"the loss \(diagonal guide, estimator='reparam', elbo='trace'\) is evaluated "
        "eagerly: the compiled loss",
    ):
        fit = zoo.fit(
            model,
            "diagonal",
            (x, y),
            num_steps=3,
            batch_size=20,
            run=zoo.Run(progress=False),
        )
    assert fit.options["jit"].startswith("eager (the compiled loss")
    guide = guides.get("diagonal")(model)
    strict = zoo.Objective(model, guide, jit=True)
    with pytest.raises(
        RuntimeError, match=r"cannot compile this loss \(diagonal guide.*: the comp"
    ):
        strict.loss(x, y, 20)


def test_a_compiled_fit_takes_the_eager_fits_steps():
    """Plain SGD on the same draws: the compiled and the eager fit end at the same posterior."""
    ends = {}
    for jit in (False, True):
        model = BayesianMLP(3, (6,), 2, task="regression")
        fit = zoo.fit(
            model, "lowrank", data(), num_steps=30, batch_size=8, lr=1e-4,
            optim=zoo.Optim(optimizer="sgd"), engine=zoo.Engine(jit=jit),
            run=zoo.Run(progress=False),
        )  # fmt: skip
        ends[jit] = [p.detach().clone() for p in fit.guide.parameters()]
        assert fit.options["jit"] == ("compiled" if jit else "eager (jit=False)")
    for a, b in zip(ends[False], ends[True]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def seeded_fit(family, options, jit, num_steps=20, **run_options):
    """The guide parameters and losses of a seeded fit (``jit`` as given)."""
    model = BayesianMLP(3, (6,), 2, task="regression")
    fit = zoo.fit(
        model, guides.family(family, **options), data(40), num_steps=num_steps, batch_size=8,
        seed=3, engine=zoo.Engine(jit=jit), run=zoo.Run(progress=False, **run_options),
    )  # fmt: skip
    if not fit.interrupted:
        assert fit.options["jit"] == ("compiled" if jit else "eager (jit=False)")
    return [p.detach().clone() for p in fit.guide.parameters()], fit.losses


@pytest.mark.parametrize("label", sorted(PRIMARY))
def test_a_fits_first_steps_on_the_cpu_are_the_eager_fits_to_the_bit(label):
    """On the CPU every graph runs in the traced order for the whole fit: the operations of the
    eager loss and of its autograd backward, so a seeded fit ends at the same parameters as
    with ``jit=False``."""
    assert not zoo.inference.compiled.OPTIMISED_EXECUTION["cpu"]
    params, losses = seeded_fit(*PRIMARY[label], jit=True)
    eager_params, eager_losses = seeded_fit(*PRIMARY[label], jit=False)
    for a, b in zip(params, eager_params):
        assert torch.equal(a, b)
    assert (
        losses == eager_losses
    )  # the reported values too (zoo.inference.surrogate reads no float back)


def test_one_plan_for_the_whole_fit_and_a_resumed_fit_continues_exactly(monkeypatch, tmp_path):
    """A fit on the CPU builds one graph per minibatch shape, in the traced order, and keeps it
    to its last step; a fit interrupted and resumed ends at the uninterrupted fit's
    parameters, to the bit."""
    built = []
    init = zoo.inference.compiled.ExecutorSetting.__init__

    def record(self, function, optimised):
        built.append(bool(optimised))
        init(self, function, optimised)

    monkeypatch.setattr(zoo.inference.compiled.ExecutorSetting, "__init__", record)
    params, _ = seeded_fit("matrix_normal", {}, jit=True)
    assert built == [False]
    for stop in (4, 13):
        checkpoint = tmp_path / f"stop{stop}.pt"

        def interrupt(state, stop=stop):
            if state.step == stop:
                raise KeyboardInterrupt

        seeded_fit("matrix_normal", {}, True, checkpoint=checkpoint, callbacks=[interrupt])
        resumed, _ = seeded_fit("matrix_normal", {}, True, resume=checkpoint)
        for a, b in zip(params, resumed):
            assert torch.equal(a, b), stop


def test_bad_jit_values_are_refused():
    with pytest.raises(ValueError, match="jit must be 'auto', True or False"):
        zoo.fit(
            BayesianMLP(3, (4,), 2, task="regression"),
            "diagonal",
            data(),
            num_steps=1,
            engine=zoo.Engine(jit="yes"),
        )


def test_auto_compiles_a_short_fit_as_a_long_one():
    """The decision does not depend on the run's length: a fit extended by a resume computes
    what the longer fit computes."""
    model = BayesianMLP(3, (6,), 2, task="regression")
    fit = zoo.fit(
        model,
        "diagonal",
        data(),
        num_steps=3,
        batch_size=20,
        run=zoo.Run(progress=False),
    )
    assert fit.options["jit"] == "compiled"


def test_a_one_step_fit_traces_nothing(monkeypatch):
    """The first step is eager (it validates the model) and so is the check of the last
    update: a one-step fit compiles no graph, even under jit=True."""

    def refuse(*args, **kwargs):
        raise AssertionError("a one-step fit traced a graph")

    monkeypatch.setattr(zoo.inference.compiled, "trace", refuse)
    model = BayesianMLP(3, (6,), 2, task="regression")
    fit = zoo.fit(
        model,
        "diagonal",
        data(),
        num_steps=1,
        engine=zoo.Engine(jit=True),
        run=zoo.Run(progress=False),
    )
    assert fit.steps == 1 and not fit.skipped_steps


def test_auto_compiles_a_large_cpu_step_and_it_takes_the_eager_steps():
    """``jit="auto"`` compiles at any size (on the CPU the traced graph replays the eager
    operations, without Pyro's per-site Python): a seeded fit of a 784-400-400-10 MLP, large
    enough for torch's threads, ends where the eager fit does."""
    x, y = torch.randn(64, 784), torch.randint(0, 10, (64,))

    def run(jit):
        torch.manual_seed(0)
        model = BayesianMLP(784, (400, 400), 10, task="classification")
        return zoo.fit(model, "diagonal", (x, y), num_steps=4, batch_size=32, lr=0.01, seed=0,
                       engine=zoo.Engine(jit=jit), run=zoo.Run(progress=False))  # fmt: skip

    auto, eager = run("auto"), run(False)
    assert auto.options["jit"] == "compiled"
    assert auto.losses == eager.losses
    for a, b in zip(auto.guide.parameters(), eager.guide.parameters()):
        assert torch.equal(a, b)


def test_ctrl_c_inside_a_graph_interrupts_the_fit(tmp_path, monkeypatch):
    """TorchScript turns Ctrl-C into ``RuntimeError: KeyboardInterrupt``; the fit must stop as on
    any Ctrl-C (partial result, checkpoint written), not crash."""
    real_trace = zoo.inference.compiled.trace
    calls = []

    class Interrupted:
        def __init__(self, graph):
            self.graph = graph

        def __call__(self, *args):
            calls.append(1)
            # batches of 8, 8, 4: two graphs, each checked CHECK_RUNS times; then steps 1-4
            if len(calls) == 2 * zoo.inference.compiled.CHECK_RUNS + 4:  # step 4's call
                raise RuntimeError(
                    "The following operation failed in the TorchScript interpreter.\n"
                    "RuntimeError: KeyboardInterrupt: <EMPTY MESSAGE>"
                )
            return self.graph(*args)

    monkeypatch.setattr(
        zoo.inference.compiled, "trace", lambda *a, **k: Interrupted(real_trace(*a, **k))
    )
    checkpoint = tmp_path / "fit.ckpt"
    model = BayesianMLP(3, (6,), 2, task="regression")
    fit = zoo.fit(
        model, "diagonal", data(), num_steps=30, batch_size=8, engine=zoo.Engine(jit=True),
        run=zoo.Run(checkpoint=checkpoint, progress=False),
    )  # fmt: skip
    assert fit.interrupted and 0 < fit.steps < 30 and checkpoint.exists()


@pytest.mark.parametrize("optimised", [True, False])
def test_a_replanned_graph_whose_draws_differ_runs_in_the_traced_order(monkeypatch, optimised):
    """TorchScript's executor profiles a graph on its first run and re-plans it for the runs
    after. With the prior's squared norm in plain operations (no custom function between them),
    the re-planned block-diagonal graph draws the noise site's random number before the
    weights' (traced: last), so from its second run on it evaluates the loss on other draws than
    the eager loss for the same seed (0.2-1% off here). Checked on its first run only it would be
    kept (``CHECK_RUNS = 1``, below); the check runs a graph ``CHECK_RUNS`` times, refuses the
    re-planned graph, and traces it again to run in the traced order: compiled, and equal to
    the eager loss at every run. ``OPTIMISED_EXECUTION[device] = False`` (the CPU's plan) takes
    the traced order at once."""
    monkeypatch.setitem(zoo.inference.compiled.OPTIMISED_EXECUTION, "cpu", optimised)
    default_runs = zoo.inference.compiled.CHECK_RUNS
    monkeypatch.setattr(zoo.priors.fixed, "squared_norm", lambda x: x.square().sum(-1))
    x, y = data()

    def later_losses(runs):
        monkeypatch.setattr(zoo.inference.compiled, "CHECK_RUNS", runs)
        model = BayesianMLP(3, (6,), 2, task="regression")
        guide = guides.get("block_diagonal")(model)
        eager, compiled = zoo.Objective(model, guide, jit=False), zoo.Objective(model, guide)
        eager.setup(x, y)
        compiled.setup(x, y)
        losses = []
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no fallback warning
            for seed in (1, 2, 3):
                pyro.set_rng_seed(seed)
                a = eager.loss(x, y, 100)
                pyro.set_rng_seed(seed)
                losses.append((a.item(), compiled.loss(x, y, 100).item()))
        (graph,) = compiled.backend.graphs.values()
        return compiled.jit_state, losses, graph.optimised

    if optimised:
        state, losses, replanned = later_losses(1)
        assert state == "compiled" and replanned
        assert any(abs(a - b) > 1e-3 * abs(a) for a, b in losses[1:])  # re-planned: off
    state, losses, replanned = later_losses(default_runs)
    assert state == "compiled" and not replanned
    assert all(abs(a - b) <= 1e-5 * abs(a) for a, b in losses)
    assert torch._C._get_graph_executor_optimize()  # the caller's setting, restored


def test_mc_dropout_with_local_reparameterisation_compiles_and_equals_the_eager_loss():
    """The README's compare row (MC dropout, estimator="local") fell back to the eager loss on
    MNIST: the re-planned graph swapped a layer's mask and pre-activation noise draws."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (40,), generator=g)
    model = zoo.models.LeNet5(hidden=20)
    guide = guides.get("mc_dropout")(model, p=0.1)
    eager = zoo.Objective(model, guide, estimator="local", jit=False)
    compiled = zoo.Objective(model, guide, estimator="local", jit=True)
    eager.setup(x, y)
    compiled.setup(x, y)
    for seed in range(5):
        pyro.set_rng_seed(seed)
        a = eager.loss(x, y, 5000)
        pyro.set_rng_seed(seed)
        b = compiled.loss(x, y, 5000)
        assert torch.allclose(a, b, rtol=1e-5), (seed, a.item(), b.item())
    assert compiled.jit_state == "compiled"


def test_trace_makes_a_function_of_its_own():
    """``zoo.inference.compiled.trace`` wraps the tracer's private entry point: it must give a
    function equal to the eager one, with its gradient, registered nowhere process-wide
    (TorchScript's shared compilation unit never frees what is put in it). Fails when torch changes
    that entry point."""
    shared = torch.jit._state._python_cu
    before = len(shared.get_functions())
    w = torch.randn(4, 4, requires_grad=True)
    x = torch.randn(3, 4)

    def f(w, x):
        return (x @ w).tanh().sum()

    traced = zoo.inference.compiled.trace(f, (w, x))
    assert isinstance(traced, torch.ScriptFunction)
    assert "aten::tanh" in str(traced.graph)
    other = torch.randn(3, 4)
    torch.testing.assert_close(traced(w, other), f(w, other))
    (grad,) = torch.autograd.grad(traced(w, other), w)
    torch.testing.assert_close(grad, torch.autograd.grad(f(w, other), w)[0])
    assert len(shared.get_functions()) == before


def _resident_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


@pytest.mark.slow  # quick tier: under three minutes
def test_many_compiled_fits_keep_no_memory():
    """A seed sweep in one process must not grow it: each fit's traced graphs go with the fit.
    ``torch.jit.trace`` kept about 2.4 MiB per fit of this size for the process's life."""
    import gc
    import os

    if not os.path.exists("/proc/self/statm"):
        pytest.skip("needs /proc")
    x, y = data(64)

    def one(seed):
        model = BayesianMLP(3, (16,), 2, task="regression")
        result = zoo.fit(
            model, "diagonal", (x, y), num_steps=12, batch_size=32, seed=seed,
            engine=zoo.Engine(jit=True), run=zoo.Run(progress=False),
        )  # fmt: skip
        assert result.options["jit"] == "compiled"
        del result, model
        gc.collect()

    for seed in range(8):  # allocator pools settle
        one(seed)
    start = _resident_mib()
    for seed in range(40):
        one(seed)
    growth = (_resident_mib() - start) / 40
    assert growth < 0.4, f"the process grew {growth:.2f} MiB per fit"


def test_a_loss_backend_is_one_subclass_and_a_declined_call_runs_eagerly():
    """The seam a torch.compile backend would use: a LossBackend subclass set on the objective
    evaluates the loss; where it declines (returns None, with a reason) the eager backend runs
    and the objective says why."""
    from zoo.inference.backends import EagerLoss, LossBackend

    class Counted(LossBackend):  # the eager loss through the interface, counted
        name = "counted"

        def __init__(self, eager: EagerLoss):
            self.eager, self.params, self.calls, self.decline = eager, eager.params, 0, False

        def function_for(self, x, y, data_scale, kl_weight):
            self.calls += 1
            if self.decline:
                self.refused = "declined on purpose"
                return None
            return self.eager.function_for(x, y, data_scale, kl_weight)

    x, y = data()
    model = BayesianMLP(3, (6,), 2, task="regression")
    objective = zoo.Objective(model, guides.get("diagonal")(model), jit=False)
    objective.setup(x, y)
    objective.use(Counted(objective.eager))
    pyro.set_rng_seed(0)
    through = objective.loss(x, y, 100)
    pyro.set_rng_seed(0)
    eager = objective.loss(x, y, 100, eager=True)
    assert objective.backend.calls == 1 and torch.equal(through, eager)
    assert objective.jit_state == "counted"
    objective.backend.decline = True
    with pytest.warns(RuntimeWarning, match="declined on purpose"):
        objective.loss(x, y, 100)
    assert objective.jit_state == "eager (declined on purpose)"


def test_the_tracer_works_on_this_torch():
    """The traced backend rests on TorchScript's tracer, which torch deprecates. This names the
    releases it was run on and fails loudly on one where tracing no longer works; the library
    shows no deprecation notice of its own on a compiled fit."""
    on = zoo.inference.compiled.TRACED_ON
    release = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    hint = (
        f"TorchScript tracing worked on torch {', '.join(on)}; on torch {torch.__version__} "
        "{what}: the traced loss backend (zoo.inference.compiled) needs a replacement "
        "(jit=False runs the eager backend meanwhile)"
    )
    try:
        function = zoo.inference.compiled.trace(lambda x: (x * 2).sum(), (torch.ones(3),))
        value = function(torch.arange(3.0))
    except Exception as err:  # noqa: BLE001 (any failure is the signal)
        pytest.fail(hint.format(what=f"it fails ({type(err).__name__}: {err})"))
    assert value.item() == 6.0, hint.format(what="it computes something else")
    assert tuple(map(int, release.split("."))) <= tuple(map(int, on[-1].split("."))), hint.format(
        what="it has not been run yet: run the suite and add the release to TRACED_ON"
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit = zoo.fit(BayesianMLP(3, (4,), 2, task="regression"), "diagonal", data(),
                      num_steps=3, batch_size=20, run=zoo.Run(progress=False))  # fmt: skip
    assert fit.options["jit"] == "compiled"
    assert not [w for w in caught if "jit" in str(w.message)], [str(w.message) for w in caught]


#: Operations whose value changes from call to call although their arguments are constants.
RANDOM_OPS = ("aten::randn", "aten::rand", "aten::normal", "aten::bernoulli", "aten::uniform")
#: Operations that make or move a tensor's data: from constants alone, the same data each call.
MOVES = ("aten::to", "aten::_to_copy", "aten::lift_fresh", "aten::copy_")


def moved_constants(graph) -> list[str]:
    """The nodes of a traced graph that make or move a tensor of more than one element from
    constants alone: work the trace repeats on every call (on a GPU, a copy from the host inside
    each step, which a CUDA graph cannot hold)."""
    constant, found = set(), []
    for node in graph.nodes():
        kind, inputs = node.kind(), list(node.inputs())
        if kind.startswith(RANDOM_OPS) or not (
            kind == "prim::Constant" or (inputs and all(v in constant for v in inputs))
        ):
            continue
        constant.update(node.outputs())
        for out in node.outputs():
            sizes = out.type().sizes() if out.type().kind() == "TensorType" else None
            if kind in MOVES and sizes is not None and math.prod(sizes) > 1:
                found.append(str(node).strip())
    return found


@pytest.mark.parametrize("case", list(CASES))
def test_the_compiled_loss_builds_no_tables_on_each_call(case, monkeypatch):
    """What a guide builds once (index tables, layouts) is a constant of the traced graph, not
    rebuilt on every call: the Posch family's joint-draw layout was once keyed by sizes that
    the tracer hands out as tensors, so the trace recorded its construction and every CUDA
    replay copied it from the host (the capture then failed). The joint draw is forced, as on
    a GPU."""
    import guides.posch_joint

    monkeypatch.setattr(guides.posch_joint, "joint_draw_pays", lambda *args: True)
    family, options = CASES[case]
    _, compiled, _ = objectives(family, options)
    x, y = data()
    compiled.loss(x, y, 100)
    (graph,) = compiled.backend.graphs.values()
    assert moved_constants(graph.graph) == []


class _Recurrent(torch.nn.Module):
    def __init__(self, cell):
        super().__init__()
        self.rnn = cell(4, 8, batch_first=True)
        self.out = torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.out(self.rnn(x)[0][:, -1])


@pytest.mark.parametrize("cell", [torch.nn.LSTM, torch.nn.GRU])
@pytest.mark.parametrize("family", ["diagonal", "lowrank", "mc_dropout"])
def test_a_fused_recurrent_network_compiles_on_the_cpu_and_takes_the_eager_steps(cell, family):
    """The traced loss takes each step's drawn weights into the fused kernel, as the eager loss
    does (no cached weight is frozen): a seeded fit compiled on the CPU ends where the eager
    one does, step for step. On CUDA it stays eager (not measured there)."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(48, 5, 4, generator=g), torch.randint(0, 3, (48,), generator=g)

    def run(jit):
        torch.manual_seed(1)
        model = zoo.models.from_module(_Recurrent(cell), init="fresh")
        fit = zoo.fit(model, family, (x, y), num_steps=25, batch_size=16, lr=0.01, seed=0,
                      engine=zoo.Engine(jit=jit), run=zoo.Run(progress=False))  # fmt: skip
        return fit

    compiled, eager = run(True), run(False)
    assert compiled.options["jit"] == "compiled"
    assert compiled.losses == eager.losses
    for (name, a), (_, b) in zip(compiled.guide.named_parameters(), eager.guide.named_parameters()):
        assert torch.equal(a, b), name
    model = zoo.models.from_module(_Recurrent(cell))
    refusal = zoo.inference.compiled.compile_refusal(model, guides.AutoDiagonal(model), 1, "cuda")
    assert "compiled on the CPU only" in refusal
