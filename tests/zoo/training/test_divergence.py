"""The divergence check read every k steps (zoo.training.step, zoo.training.divergence) and the
CUDA-graph step's static-buffer path (zoo.training.cuda_graph, run eagerly here: the capture itself
is tested in test_cuda.py)."""

import math
import warnings

import pytest
import torch

import guides
import zoo
import zoo.training.fitting
from tests.families import CASES
from zoo.models import BayesianMLP
from zoo.training.options import grouped


def regression(n=200, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g)
    return x, x.sum(1) + 0.1 * torch.randn(n, generator=g)


def fit(data, family="diagonal", model=None, guide_options=None, **options):
    kwargs = dict(num_steps=57, batch_size=32, lr=0.01, progress=False, seed=0)
    kwargs.update(options)
    guide = guides.family(family, **guide_options) if guide_options else family
    return zoo.fit(model or BayesianMLP(3, (16,), 1), guide, data, **grouped(kwargs))


def same_parameters(a, b, **tolerance) -> bool:
    sa, sb = a.guide.state_dict(), b.guide.state_dict()
    if not tolerance:
        return all(torch.equal(sa[k], sb[k]) for k in sa)
    return all(torch.allclose(sa[k], sb[k], **tolerance) for k in sa)


@pytest.mark.parametrize("clip", [None, 5.0])
def test_reading_every_k_steps_gives_the_per_step_fit(clip):
    """The same updates in the same order: identical losses, epoch losses and parameters, with
    a learning-rate and a KL schedule and groups cut by epoch ends (57 steps of 7 per epoch)."""
    data = regression()
    options = dict(lr_schedule="exponential", kl_weight=lambda i: min(1.0, i / 20))
    every_step = fit(data, clip_grad_norm=clip, **options)
    batched = fit(data, clip_grad_norm=clip, check_every=10, **options)
    assert every_step.options["check_every"] == 1 and batched.options["check_every"] == 10
    assert batched.losses == every_step.losses and len(batched.losses) == 57
    assert batched.epoch_losses == every_step.epoch_losses
    assert same_parameters(batched, every_step)


def diverging(check_every, num_steps=20):
    """SGD at lr 1e3: step 0's update leaves finite parameters whose loss is NaN."""
    x, y = regression(64)
    model = BayesianMLP(3, (16,), 1)
    guide = guides.AutoDiagonal(model)
    with torch.no_grad():
        guide(x, y)
    initial = {k: v.clone() for k, v in guide.state_dict().items()}
    with pytest.raises(zoo.FitDivergedError) as err:
        zoo.fit(
            model,
            guide,
            (x, y),
            num_steps=num_steps,
            batch_size=16,
            optim=zoo.Optim(optimizer="sgd"),
            run=zoo.Run(progress=False),
            engine=zoo.Engine(check_every=check_every),
            lr=1e3,
        )
    return err.value, initial


def test_a_divergence_found_at_the_read_names_the_first_bad_step_and_restores():
    err, initial = diverging(check_every=10)
    message = str(err)
    assert "diverged at step 1 (epoch 0)" in message
    assert "back at the parameters of step 0" in message and "every 10 steps" in message
    assert "non-finite gradients at sites" not in message  # .grad holds a later step's
    result = err.result
    assert result.steps == 1  # the history ends before the first non-finite step
    for k, v in result.guide.state_dict().items():
        assert torch.equal(v, initial[k]), k
    assert torch.isfinite(result.predict(regression(8)[0], num_samples=3).mean).all()


def test_the_skip_flag_stops_the_update_on_the_device():
    """Steps 1-9 are taken by the device before the host reads them: the fused optimiser must
    have skipped all nine, or the parameters would be NaN after the first."""
    err, _ = diverging(check_every=10)
    state = err.result.guide.state_dict()
    assert all(torch.isfinite(v).all() for v in state.values())


def outlier_data():
    """A finite input so large that its minibatch's loss overflows: non-finite once an epoch,
    at steps the shuffle decides, whatever the parameters."""
    x, y = regression(100, seed=1)
    x[7, 0] = 1e30
    return x, y


def test_skip_records_the_same_steps_as_the_per_step_check():
    runs = {}
    for every in (1, 10):
        with pytest.warns(RuntimeWarning, match="6 of 30 steps were skipped"):
            runs[every] = fit(
                outlier_data(),
                model=BayesianMLP(3, (8,), 1),
                num_steps=30,
                batch_size=20,
                on_divergence="skip",
                check_every=every,
            )
    assert runs[10].skipped_steps == runs[1].skipped_steps == [1, 8, 10, 15, 20, 28]
    assert runs[10].steps == 24 and all(math.isfinite(v) for v in runs[10].losses)
    assert all(torch.isfinite(p).all() for p in runs[10].guide.parameters())


def test_skip_gives_up_after_too_many_in_a_row(monkeypatch):
    monkeypatch.setattr(zoo.training.divergence, "MAX_CONSECUTIVE_SKIPS", 4)
    x, y = regression()
    x[:, 0] = 1e30  # every minibatch's loss overflows
    with pytest.raises(zoo.FitDivergedError, match="4 steps in a row") as err:
        fit((x, y), batch_size=16, on_divergence="skip", check_every=10)
    assert err.value.result.skipped_steps == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "options, message",
    [
        ({"check_every": 0}, "check_every must be 'auto' or a positive integer"),
        ({"check_every": True}, "check_every must be 'auto' or a positive integer"),
        ({"check_every": "often"}, "check_every must be 'auto' or a positive integer"),
        ({"check_every": 5, "optimizer": torch.optim.RMSprop}, "skips a non-finite update"),
        ({"cuda_graph": "yes"}, "cuda_graph must be 'auto', True or False"),
        ({"cuda_graph": True}, "cuda_graph=True needs a CUDA device"),
    ],
)
def test_bad_check_every_and_cuda_graph_fail_before_training(options, message):
    steps = []
    with pytest.raises(ValueError, match=message):
        fit(regression(), callbacks=[steps.append], device="cpu", **options)
    assert steps == []


def test_auto_reads_every_step_on_the_cpu():
    assert fit(regression(), num_steps=3).options["check_every"] == 1


def test_cuda_graph_needs_the_compiled_loss(monkeypatch):
    monkeypatch.setattr(zoo.training.rules, "device_refusal", lambda device: None)
    with pytest.raises(ValueError, match="needs the compiled loss"):
        fit(regression(), cuda_graph=True, jit=False)


def capture_on_cpu(monkeypatch, record) -> None:
    """The graph step's capture path on the CPU: ``record(step, run)`` stands in for the CUDA
    capture, and the warm-up runs without a CUDA stream."""
    import zoo.training.cuda_graph

    def side_stream(self, run):
        self.optimizer.zero_grad(set_to_none=True)
        run()

    init = zoo.training.cuda_graph.GraphedStep.__init__
    monkeypatch.setattr(
        zoo.training.cuda_graph.GraphedStep,
        "__init__",
        lambda self, *a, **k: init(self, *a, **{**k, "capture": True}),
    )
    monkeypatch.setattr(zoo.training.cuda_graph.GraphedStep, "_record", record)
    monkeypatch.setattr(zoo.training.cuda_graph.GraphedStep, "_on_side_stream", side_stream)


@pytest.fixture
def graph_on_cpu(monkeypatch):
    """``cuda_graph=True`` on the CPU: the GraphedStep's static buffers, tensor learning rates
    and in-step skip flag, run eagerly (``capture`` is only on CUDA)."""
    monkeypatch.setattr(zoo.training.rules, "device_refusal", lambda device: None)


@pytest.mark.parametrize("label", list(CASES))
def test_the_graphed_step_gives_the_eager_fit(graph_on_cpu, label):
    """Every family: the same losses and parameters as the per-step eager fit within float
    tolerance (the learning rate becomes a float32 tensor: its rounding differs), with a
    schedule of learning rates and KL weights and a last, smaller batch that runs eagerly."""
    family, options = CASES[label]
    data = regression(100)
    kwargs = dict(
        num_steps=25,
        batch_size=32,  # 100 = 3 x 32 + 4: every fourth step runs eagerly between replays
        guide_options=options,
        lr_schedule="exponential",
        kl_weight=lambda i: min(1.0, i / 10),
        model=BayesianMLP(3, (8,), 1),
    )
    eager = fit(data, family, jit=False, **kwargs)
    kwargs["model"] = BayesianMLP(3, (8,), 1)
    graphed = fit(data, family, cuda_graph=True, **kwargs)
    assert graphed.options["cuda_graph"] is True and graphed.options["jit"] == "compiled"
    assert graphed.options["check_every"] == 20  # "auto" with a graph
    assert graphed.losses == pytest.approx(eager.losses, rel=1e-4)
    assert same_parameters(graphed, eager, rtol=1e-4, atol=1e-5)


def test_the_graphed_step_accumulates_as_the_eager_step(graph_on_cpu):
    """Two minibatches per step through the static buffers (two pairs of them) give the eager
    accumulated fit; the last, smaller step of each epoch runs eagerly."""
    data = regression(100)
    kwargs = dict(num_steps=12, batch_size=16, accumulate=2, lr_schedule="exponential")
    eager = fit(data, jit=False, **kwargs)
    graphed = fit(data, cuda_graph=True, **kwargs)
    assert graphed.options["accumulate"] == 2 and graphed.options["jit"] == "compiled"
    assert graphed.losses == pytest.approx(eager.losses, rel=1e-4)
    assert same_parameters(graphed, eager, rtol=1e-4, atol=1e-5)


def test_the_graphed_step_resumes_from_its_checkpoint(graph_on_cpu, tmp_path):
    data, ckpt = regression(), tmp_path / "fit.ckpt"
    whole = fit(data, num_steps=40, lr_schedule="exponential", cuda_graph=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit(
            data,
            num_steps=40,
            lr_schedule="exponential",
            cuda_graph=True,
            checkpoint=ckpt,
            checkpoint_every=10,
            callbacks=[lambda state: state.step == 20],
        )
    resumed = fit(data, num_steps=40, lr_schedule="exponential", cuda_graph=True, resume=ckpt)
    assert resumed.losses == whole.losses
    assert same_parameters(resumed, whole)


def test_callbacks_read_every_step_but_copies_stay_every_k(monkeypatch):
    """A callback sees each step's loss (the host reads every step), while the parameter copy
    is still taken at most every ``check_every`` steps."""
    copies = []
    begin = zoo.training.divergence.DivergenceGuard.begin
    monkeypatch.setattr(
        zoo.training.divergence.DivergenceGuard,
        "begin",
        lambda self, step: (copies.append(step), begin(self, step)),
    )
    seen = []
    result = fit(
        regression(), num_steps=30, check_every=5, callbacks=[lambda s: seen.append(s.loss)]
    )
    assert seen == result.losses and len(seen) == 30
    assert copies == [0, 5, 10, 15, 20, 25, 30]


def test_a_divergence_seen_by_a_callback_step_restores_the_first_parameters():
    x, y = regression(64)
    guide = guides.AutoDiagonal(BayesianMLP(3, (16,), 1))
    with torch.no_grad():
        guide(x, y)
    initial = {k: v.clone() for k, v in guide.state_dict().items()}
    seen = []
    with pytest.raises(zoo.FitDivergedError, match="diverged at step 1") as err:
        fit(
            (x, y),
            model=guide.model,
            family=guide,
            optimizer="sgd",
            lr=1e3,
            batch_size=16,
            check_every=10,
            callbacks=[lambda s: seen.append(s.step)],
        )
    assert seen == [1]  # step 0 reached the callback; step 1 raised at its read
    for k, v in err.value.result.guide.state_dict().items():
        assert torch.equal(v, initial[k]), k


def test_a_failed_capture_warns_once_and_the_fit_goes_on_eagerly(graph_on_cpu, monkeypatch):
    """The capture path on the CPU, its capture made to fail as an operation a CUDA graph cannot
    hold fails it: one warning naming the cause, the step it was capturing taken eagerly, every
    later step eager; the fit ends as the eager fit does (within the tensor learning rate's
    rounding) and records why."""

    def fail(self, run):
        raise RuntimeError("operation not permitted when stream is capturing")

    capture_on_cpu(monkeypatch, fail)
    data = regression(96)
    eager = fit(data, jit=False, num_steps=12)
    with pytest.warns(RuntimeWarning, match="capture of the step failed") as caught:
        failed = fit(data, cuda_graph=True, num_steps=12)
    assert sum("capture" in str(w.message) for w in caught) == 1
    assert failed.options["cuda_graph"].startswith("failed, ran eagerly (operation not")
    assert len(failed.losses) == 12
    assert failed.losses == pytest.approx(eager.losses, rel=1e-4)
    assert same_parameters(failed, eager, rtol=1e-4, atol=1e-5)
