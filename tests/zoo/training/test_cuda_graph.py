"""The CUDA-graph step as the default on CUDA (``cuda_graph="auto"``, zoo.training.rules) and its
check against the eager step on the first replay (zoo.training.cuda_graph). The capture is emulated
on the CPU: a recorded "graph" whose replay runs the recorded body, as a CUDA graph replays its
kernels; what only a GPU can show (the generator's offsets, the capture itself) is in
test_cuda.py."""

import pytest
import torch

import zoo
import zoo.training.cuda_graph
from tests.zoo.training.test_divergence import capture_on_cpu, fit, regression, same_parameters


class ReplayedBody:
    """A stand-in for ``torch.cuda.CUDAGraph``: ``replay`` runs the recorded body on the static
    buffers, its gradients written afresh (a captured backward pass assigns them)."""

    def __init__(self, step, run, perturb=0.0):
        self.step, self.run, self.perturb = step, run, perturb
        self.replays = 0

    def replay(self):
        self.replays += 1
        self.step.optimizer.zero_grad(set_to_none=False)
        self.run()
        if self.perturb:
            with torch.no_grad():
                for group in self.step.optimizer.param_groups:
                    for p in group["params"]:
                        p.add_(self.perturb)


class Captures(list):
    """The graphs recorded in a test; ``perturb``: the shift of the next ones' replays."""

    perturb = 0.0


@pytest.fixture
def emulated_capture(monkeypatch):
    """Every fit may take the graph step (the CUDA test of the rules lifted) and its capture
    records :class:`ReplayedBody`; setting ``perturb`` on the returned :class:`Captures` makes
    later replays shift every parameter (a graph that does not compute the eager step)."""
    monkeypatch.setattr(zoo.training.rules, "device_refusal", lambda device: None)
    recorded = Captures()

    def record(self, run):
        self.optimizer.zero_grad(set_to_none=True)
        self.graph = ReplayedBody(self, run, recorded.perturb)
        recorded.append(self.graph)

    capture_on_cpu(monkeypatch, record)
    return recorded


def test_auto_takes_the_graph_step_wherever_the_fit_allows_it(emulated_capture):
    """The default ``cuda_graph="auto"`` replays a graph when the device allows it, with no
    option set, and the fit is the eager fit's (within the float32 learning rate's rounding)."""
    data = regression(100)
    eager = fit(data, jit=False, cuda_graph=False, num_steps=30)
    graphed = fit(data, num_steps=30)
    assert len(emulated_capture) == 1 and emulated_capture[0].replays >= 15
    assert graphed.options["cuda_graph"] is True and graphed.options["check_every"] == 20
    assert graphed.losses == pytest.approx(eager.losses, rel=1e-4)
    assert same_parameters(graphed, eager, rtol=1e-4, atol=1e-5)


def test_a_replay_that_differs_from_the_eager_step_is_given_up(emulated_capture):
    """The first replay is checked against the same step taken eagerly from the same state: a
    graph that computes another step warns once, is dropped, and the fit is the eager fit (the
    replay's update was undone, so it never reaches the parameters)."""
    data = regression(100)
    eager = fit(data, jit=False, cuda_graph=False, num_steps=30)
    emulated_capture.perturb = 0.5
    with pytest.warns(RuntimeWarning, match="failed its check against the eager step") as caught:
        checked = fit(data, num_steps=30)
    assert len(caught) == 1
    assert checked.options["cuda_graph"].startswith(
        "failed, ran eagerly (the replayed step differs from the eager one: parameter 0 by"
    )
    assert checked.losses == pytest.approx(eager.losses, rel=1e-4)
    assert same_parameters(checked, eager, rtol=1e-4, atol=1e-5)


def test_the_check_draws_the_replays_random_numbers_again():
    """The check's eager step runs from the generator state the replay started from: a body
    that draws gives the same values both times (on the CPU generator here; the CUDA generator's
    offsets are restored the same way by ``zoo.runtime.rng.forked``)."""
    param = torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.SGD([param], lr=0.1)
    step = object.__new__(zoo.training.cuda_graph.GraphedStep)
    step.optimizer, step.params, step.device = opt, [param], torch.device("cpu")
    step.loss, step.norm, step.failed = torch.zeros(()), torch.zeros(()), None

    def run():
        loss = (param * torch.randn(3)).sum()
        loss.backward()
        opt.step()
        step.loss.copy_(loss.detach())

    step.graph = ReplayedBody(step, run)
    torch.manual_seed(0)
    step._checked_replay(run)
    assert step.failed is None and step.graph is not None
    torch.manual_seed(0)
    expected = -0.1 * torch.randn(3)
    assert torch.allclose(param.detach(), expected)


def test_auto_is_off_where_the_fit_does_not_allow_the_graph(monkeypatch):
    """On the CPU the graph is off and nothing says more; where the device allows it, ``"auto"``
    turns it off with the reason (eager loss, an optimiser that cannot skip on the device) and
    ``True`` refuses the same fit before training."""
    plain = fit(regression(64), num_steps=2)
    assert plain.options["cuda_graph"] is False
    monkeypatch.setattr(zoo.training.rules, "device_refusal", lambda device: None)
    decide, decisions = zoo.training.rules.graph_decision, []
    monkeypatch.setattr(
        zoo.training.rules,
        "graph_decision",
        lambda *a, **k: decisions.append(decide(*a, **k)) or decisions[-1],
    )
    for options, reason in (
        ({"jit": False}, "needs the compiled loss"),
        ({"optimizer": torch.optim.RMSprop}, "optimiser that skips a non-finite update"),
    ):
        result = fit(regression(64), num_steps=2, **options)
        on, why = decisions[-1]
        assert not on and reason in why
        assert result.options["cuda_graph"] is False  # on the CPU: no reason recorded
        with pytest.raises(ValueError, match=reason):
            fit(regression(64), num_steps=2, cuda_graph=True, **options)


def test_the_plan_records_why_auto_left_a_cuda_fit_without_the_graph():
    plan = zoo.training.rules.StepPlan(
        check_every=1, cuda_graph=False, accumulate=1, threads=None, graph_off="a reason"
    )
    assert plan.graph_record == "off (a reason)"
    assert zoo.training.rules.StepPlan(1, False, 1, None).graph_record is False
    assert zoo.training.rules.StepPlan(20, True, 1, None).graph_record is True


def test_auto_is_off_across_processes_and_true_is_refused():
    class Compiled:
        backend = object()

    fused = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], fused=False)
    cuda = torch.device("cuda")
    decide = zoo.training.rules.graph_decision
    assert decide("auto", Compiled(), fused, cuda, True) == (
        False,
        zoo.training.rules.NEEDS_ONE_PROCESS["cuda_graph"],
    )
    assert decide(False, Compiled(), fused, cuda, True) == (False, None)
    with pytest.raises(ValueError, match="one process"):
        decide(True, Compiled(), fused, cuda, True)


def test_a_resumed_fit_that_starts_on_the_last_batch_captures_the_full_one(
    emulated_capture, tmp_path
):
    """Steps 0-19 done, step 20 is the last, smaller batch of its epoch (200 = 6 x 32 + 8): the
    resumed fit's first step must not set the static buffers to it (every later full step would
    then run eagerly); the run equals the uninterrupted one bit for bit."""
    data, ckpt = regression(), tmp_path / "fit.ckpt"
    kwargs = dict(num_steps=40, lr_schedule="exponential")
    whole = fit(data, **kwargs)
    fit(data, checkpoint=ckpt, checkpoint_every=10, callbacks=[lambda s: s.step == 20], **kwargs)
    resumed = fit(data, resume=ckpt, **kwargs)
    step = emulated_capture[-1].step
    assert [len(x) for x, _ in step.inputs] == [32]
    assert emulated_capture[-1].replays >= 12
    assert resumed.losses == whole.losses
    assert same_parameters(resumed, whole)


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("operation not permitted when stream is capturing"),
        UserWarning("The CUDA Graph is empty"),  # a capture warning under warnings-as-errors
    ],
)
def test_a_capture_that_raises_ends_cleanly_and_the_fit_goes_on(monkeypatch, error):
    """Whatever the capture raises, the fit warns, takes that step and every later one
    eagerly, and first leaves torch's CUDA generator as a completed capture would (a capture
    that raises skips the epilogue that clears the generator's capture mark, and every later
    draw in the process then fails: seen on an H200). The generator's reset itself runs only on
    a GPU (``tests/zoo/cuda_runs.py``); here the call is counted."""
    monkeypatch.setattr(zoo.training.rules, "device_refusal", lambda device: None)
    ended = []

    def record(self, run):
        self.optimizer.zero_grad(set_to_none=True)
        raise error

    capture_on_cpu(monkeypatch, record)
    monkeypatch.setattr(
        zoo.training.cuda_graph.GraphedStep, "_end_failed_capture", lambda self: ended.append(1)
    )
    data = regression(100)
    eager = fit(data, jit=False, cuda_graph=False, num_steps=30)
    with pytest.warns(RuntimeWarning, match="capture of the step failed") as caught:
        fallen = fit(data, num_steps=30)
    assert len(caught) == 1 and ended == [1]
    assert fallen.options["cuda_graph"] == f"failed, ran eagerly ({error})"
    assert fallen.losses == pytest.approx(eager.losses, rel=1e-4)
    assert same_parameters(fallen, eager, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "family,options,optim",
    [
        ("diagonal", {}, {"optimizer": "sgd", "clip_grad_norm": 1.0}),
        ("whvi", {"covariance": "diagonal"}, {}),
    ],
)
def test_the_fits_of_the_gpu_tests_run_through_the_emulated_graph(
    emulated_capture, family, options, optim
):
    """The fits ``test_cuda.py`` compares on a GPU (``tests/zoo/cuda_runs.py``: a schedule, a
    KL warm-up, a short last batch between replays) built with the same arguments on the CPU,
    so a changed option group fails here and not only on a GPU: the replayed step gives the
    eager fit, judged as on the GPU (``cuda_runs.assert_same_fit``: WHVI's CPU fits are not
    bitwise reproducible either)."""
    from functools import partial

    from tests.zoo.cuda_runs import assert_same_fit
    from tests.zoo.cuda_runs import fit as cuda_fit

    on_cpu = {"device": "cpu", "jit": True}  # the compiled loss, as on a GPU
    again = partial(cuda_fit, family, options, optim, check_every=1, cuda_graph=False, **on_cpu)
    eager = again()
    graphed = cuda_fit(family, options, optim, cuda_graph=True, **on_cpu)
    assert graphed.options["cuda_graph"] is True and len(emulated_capture) >= 1
    assert graphed.losses == pytest.approx(eager.losses, rel=1e-4)
    assert_same_fit(eager, graphed, again, rtol=1e-3, atol=1e-4)
