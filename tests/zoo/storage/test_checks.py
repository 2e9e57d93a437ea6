"""Files that lie (zoo.storage.checks, zoo.storage.files): every tampering is refused before
use with a ValueError naming the file and the entry; random bytes are damaged, never 'pickled'."""

import os
import re
import time

import pytest
import torch

import zoo
from zoo.models import BayesianMLP
from zoo.storage import files


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 3, generator=g)
    fit = zoo.fit(BayesianMLP(3, (8,), noise=1.0), "diagonal", (x, x[:, 0]), num_steps=3,
                  run=zoo.Run(progress=False))  # fmt: skip
    path = tmp_path_factory.mktemp("fit") / "fit.pt"
    fit.save(path)
    return path.read_bytes()


def rewrite(tmp_path, saved, change):
    """The saved fit with ``change(payload)`` applied and its checksum recomputed (as an
    attacker who knows the format would: the checksum finds damage, not intent)."""
    path = tmp_path / "fit.pt"
    path.write_bytes(saved)
    payload = torch.load(path, weights_only=True)
    change(payload)
    files.atomic_save(payload, path)
    return path


def first(payload):
    return next(iter(payload["guide"]["state"]))


def set_first(value):
    return lambda p: p["guide"]["state"].__setitem__(first(p), value(p["guide"]["state"][first(p)]))


CASES = {
    "nan": (set_first(lambda t: torch.full_like(t, float("nan"))), "holds NaN or infinite"),
    "int64": (set_first(lambda t: t.long()), "is torch.int64, where a fit writes floating"),
    "shape": (set_first(lambda t: torch.zeros(2)), "shapes or dtypes differ"),
    "missing": (lambda p: p["guide"]["state"].pop(first(p)), "entries missing from the file"),
    "extra": (
        lambda p: p["guide"]["state"].__setitem__("zzz", torch.zeros(1)),
        "entries the guide does not have \\['zzz'\\]",
    ),
    "no guide": (lambda p: p.pop("guide"), "the file has no 'guide' entry"),
    "no optimiser-like entry": (lambda p: p.pop("history"), "the file has no 'history' entry"),
    "huge input": (
        lambda p: p["guide"].__setitem__("input", [[[10**6, 10**6], "float32"]]),
        "declares 1e\\+12 elements",
    ),
    "bad dtype": (
        lambda p: p["guide"].__setitem__("input", [[[2, 3], "pickle"]]),
        "has no dtype 'pickle'",
    ),
    "no family": (lambda p: p["guide"].__setitem__("spec", {}), "names no family"),
    "huge model spec": (
        lambda p: p["model"]["spec"]["args"].__setitem__("hidden", [10**6, 10**6]),
        "GiB to fit",
    ),
    "model state": (
        lambda p: p["model"]["state"].__setitem__(
            next(iter(p["model"]["state"])), torch.tensor(float("inf"))
        ),
        "model state",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_changed_fit_file_is_refused_naming_the_file(tmp_path, saved, case):
    change, phrase = CASES[case]
    path = rewrite(tmp_path, saved, change)
    with pytest.raises(ValueError, match=phrase) as err:
        zoo.load(path)
    assert str(path) in str(err.value)


def test_changed_bytes_that_still_parse_fail_the_checksum(tmp_path, saved):
    """A weight changed in place (the bytes of a tensor) loads as a wrong fit without it."""
    payload = torch.load(_write(tmp_path, saved), weights_only=True)
    key = first(payload)
    raw = bytearray(saved)
    needle = payload["guide"]["state"][key].numpy().tobytes()[:16]
    at = raw.find(needle)
    assert at > 0
    raw[at : at + 4] = b"\x7f\x7f\x7f\x7f"  # 3.4e38 in float32
    path = tmp_path / "fit.pt"
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="is damaged: its contents do not match the checksum"):
        zoo.load(path)


def _write(tmp_path, saved):
    path = tmp_path / "fit.pt"
    path.write_bytes(saved)
    return path


@pytest.mark.parametrize("seed", range(4))
def test_random_bytes_are_damaged_never_pickled(tmp_path, seed):
    path = tmp_path / "random.pt"
    path.write_bytes(torch.randint(0, 256, (5000,), generator=torch.Generator().manual_seed(seed),
                                   dtype=torch.uint8).numpy().tobytes())  # fmt: skip
    with pytest.raises(ValueError, match="is damaged") as err:
        zoo.load(path)
    assert "allow_pickle" not in str(err.value)


def test_the_untouched_file_loads(tmp_path, saved):
    assert zoo.load(_write(tmp_path, saved)).steps == 3


def test_a_killed_saves_temporary_file_is_removed_by_the_next_save(tmp_path):
    """A writer holds its temporary file's lock while it writes: a file nobody holds is a
    killed save's, whatever its writer's process id (a writer in another PID namespace has ids
    that mean nothing here); a file just made is left alone, and so is one being written."""
    import subprocess
    import sys

    from zoo.runtime import children

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()  # fmt: skip
    path = tmp_path / "fit.pt"
    killed = tmp_path / f".fit.pt.{dead}.abc123.tmp"  # nobody writes it
    writing = tmp_path / f".fit.pt.{dead}.def456.tmp"  # written now, by a pid foreign here
    young = tmp_path / f".fit.pt.{dead}.jkl000.tmp"  # just made: its lock not taken yet
    old = tmp_path / ".fit.pt.ghi789.tmp"  # no writer named, over STALE_AFTER old
    for tmp in (killed, writing, young, old):
        tmp.write_bytes(b"half a file")
    for tmp in (killed, writing):
        past = time.time() - 2 * children.LOCK_GRACE
        os.utime(tmp, (past, past))
    past = time.time() - 2 * files.STALE_AFTER
    os.utime(old, (past, past))
    with children.holding(writing):
        files.atomic_save({"format": files.FORMAT, "kind": "fit", "x": torch.zeros(2)}, path)
    assert not killed.exists() and not old.exists() and writing.exists() and path.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["fit.pt", writing.name, young.name]
    )


def test_a_chain_file_with_a_nan_draw_is_refused(tmp_path):
    from zoo.mcmc import chain as hmc

    state = {
        "format": files.FORMAT, "kind": "hmc-chain", "version": files.VERSION, "chain": 0,
        "settings": {}, "data": [], "z": {"w": torch.zeros(2)}, "step_size": 0.1,
        "inverse_mass_matrix": [[["w"], torch.ones(2)]],
        "draws": {"w": [torch.zeros(2), torch.ones(2)]},
        "stats": {name: [0.0, 0.0] for name in zoo.NUTS.stat_names},
        "rng": files.torch_rng_state(),
    }  # fmt: skip
    path = tmp_path / "chain0.pt"
    files.atomic_save(state, path)
    assert hmc.read_chain(path)["chain"] == 0
    state["draws"]["w"][1] = torch.tensor([0.0, float("nan")])
    files.atomic_save(state, path)
    with pytest.raises(ValueError, match="draws of 'w'.*NaN"):
        hmc.read_chain(path)
    for key, value, phrase in [
        ("step_size", -1.0, "step size is -1.0"),
        ("stats", {"lp": []}, "stats are not"),
        ("z", {"w": "x"}, "is a str, not a tensor"),
    ]:
        broken = {**state, key: value, "draws": {"w": [torch.zeros(2)] * 2}}
        files.atomic_save(broken, path)
        with pytest.raises(ValueError, match=phrase):
            hmc.read_chain(path)


def test_a_payload_read_back_and_saved_again_gets_a_fresh_checksum(tmp_path):
    """A resumed HMC chain saves the payload it read (checksum included) after changing it."""
    path = tmp_path / "x.pt"
    files.atomic_save({"format": files.FORMAT, "kind": "fit", "n": torch.zeros(2)}, path)
    payload = files.read(path, "fit")
    payload["n"] = torch.ones(3)
    files.atomic_save(payload, path)
    assert torch.equal(files.read(path, "fit")["n"], torch.ones(3))


def test_a_file_of_this_format_without_its_checksum_is_refused(tmp_path, saved):
    """Deleting the checksum does not turn the check off: files of this format always have one
    (only files written before checksums were recorded read without)."""
    path = tmp_path / "fit.pt"
    path.write_bytes(saved)
    payload = torch.load(path, weights_only=True)
    del payload["checksum"]
    torch.save(payload, path)
    with pytest.raises(ValueError, match="has no checksum, which every file of format 4"):
        zoo.load(path)
    payload["version"] = 2  # a file written before: read without one
    torch.save(payload, path)
    assert isinstance(zoo.load(path), zoo.FitResult)


def test_a_draws_file_relabelled_as_an_older_format_is_refused(tmp_path):
    model = zoo.models.BayesianMLP(2, (4,), task="regression", noise=0.1)
    draws = {name: torch.zeros(3, *shape) for name, shape in model.site_shapes.items()}
    path = zoo.from_draws(model, draws).save(tmp_path / "draws.pt")
    payload = torch.load(path, weights_only=True)
    payload["version"] = 1  # no checksum would be checked for a file of format 1
    torch.save(payload, path)
    with pytest.raises(ValueError, match="declares format 1, but draws files were first"):
        zoo.load(path)
    payload["version"] = "3"
    torch.save(payload, path)
    with pytest.raises(ValueError, match="format version '3' is not a whole number"):
        zoo.load(path)


def _bn_fit(tmp_path):
    from torch import nn

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    x, y = torch.randn(64, 3), torch.randint(0, 2, (64,))
    path = tmp_path / "bn.ckpt"
    fit = zoo.fit(zoo.models.from_module(net, init="module"),
        "diagonal", (x, y), num_steps=4, batch_size=32,
                  run=zoo.Run(progress=False, checkpoint=path))  # fmt: skip
    return net, (x, y), fit, path


@pytest.mark.parametrize(
    "name, value, phrase",
    [
        ("net.1.running_var", -1.0, "negative values"),
        ("net.1.num_batches_tracked", -3, "negative values"),
        ("net.1.running_mean", float("nan"), "NaN or infinite"),
    ],
)
def test_batch_norm_state_no_fit_writes_is_refused(tmp_path, name, value, phrase):
    net, data, fit, checkpoint = _bn_fit(tmp_path)
    saved = fit.save(tmp_path / "fit.pt")
    for path, key in ((saved, "model"), (checkpoint, "model")):
        payload = torch.load(path, weights_only=True)
        state = payload[key]["state"]
        state[name] = torch.full_like(state[name], value)
        files.atomic_save(payload, path)  # rewritten with its checksum, as one who knows would
    fresh = zoo.models.from_module(net, init="module")
    with pytest.raises(ValueError, match=phrase):
        zoo.load(saved, model=fresh)
    assert torch.isfinite(fresh.net[1].running_mean).all()  # refused before loading any of it
    assert (fresh.net[1].running_var >= 0).all()
    with pytest.raises(ValueError, match=phrase):
        zoo.fit(zoo.models.from_module(net, init="module"),
            "diagonal", data, num_steps=8, batch_size=32,
                run=zoo.Run(progress=False, resume=checkpoint))  # fmt: skip


def test_a_checkpoint_with_a_nan_trainable_weight_is_refused_before_a_step(tmp_path):
    net, data, _, checkpoint = _bn_fit(tmp_path)
    payload = torch.load(checkpoint, weights_only=True)
    trainable = payload["model"]["trainable"]
    assert "net.1.weight" in trainable  # batch norm's scale: deterministic, trained
    trainable["net.1.weight"] = torch.full_like(trainable["net.1.weight"], float("nan"))
    files.atomic_save(payload, checkpoint)
    steps = []
    with pytest.raises(ValueError, match="NaN or infinite"):
        zoo.fit(zoo.models.from_module(net, init="module"),
            "diagonal", data, num_steps=8, batch_size=32,
                run=zoo.Run(progress=False, resume=checkpoint,
                            callbacks=[lambda view: steps.append(view.step)]))  # fmt: skip
    assert steps == []


@pytest.mark.parametrize(
    "n, batch_size, phrase", [(65, 64, "batch_size=65 or 63"), (8, 1, "2 or more")]
)
def test_a_minibatch_of_one_for_batch_norm_is_refused_before_a_step(n, batch_size, phrase):
    from torch import nn

    net = nn.Sequential(nn.Linear(3, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    x, y = torch.randn(n, 3), torch.randint(0, 2, (n,))
    with pytest.raises(ValueError, match=f"minibatch of one example.*{phrase}"):
        zoo.fit(zoo.models.from_module(net, init="module"),
            "diagonal", (x, y), batch_size=batch_size,
                num_steps=3, run=zoo.Run(progress=False))  # fmt: skip
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y),
                                         batch_size=batch_size, drop_last=True)  # fmt: skip
    if batch_size > 1:  # dropping the last batch is a way out
        zoo.fit(zoo.models.from_module(net, init="module"), "diagonal", loader, num_steps=3,
                run=zoo.Run(progress=False))  # fmt: skip


@pytest.mark.parametrize(
    "change, phrase",
    [
        (lambda kept: kept[:, :2], r"shape \(10, 2\) and dtype torch.float32, are not what"),
        (lambda kept: kept[:, 0], r"shape \(10,\) and dtype torch.float32, are not what"),
        (lambda kept: kept.long(), "are torch.int64, where the model takes torch.float32"),
        (lambda kept: kept.double(), "are torch.float64, where the model takes torch.float32"),
    ],
    ids=["width", "1-D", "int64", "float64"],
)
def test_kept_inputs_the_network_does_not_take_are_refused_at_load(tmp_path, change, phrase):
    """A per-draw fit's kept batch-norm inputs of another width, rank or dtype (re-signed, as
    one who knows would): refused by zoo.load naming them, not raw at the first predict."""
    from torch import nn

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    x, y = torch.randn(10, 3), torch.randint(0, 2, (10,))
    fit = zoo.fit(zoo.models.from_module(net, init="module"), "diagonal", (x, y),
                  num_steps=2, batch_size=5,
                  run=zoo.Run(progress=False, statistics="per_draw"))  # fmt: skip
    saved = fit.save(tmp_path / "fit.pt")
    payload = torch.load(saved, weights_only=True)
    kept = payload["model"]["statistics_inputs"]
    assert kept.shape == (10, 3)
    payload["model"]["statistics_inputs"] = change(kept).contiguous()
    files.atomic_save(payload, saved)
    with pytest.raises(ValueError, match=r"the saved model: the kept training inputs") as err:
        zoo.load(saved, model=zoo.models.from_module(net, init="module"))
    assert re.search(phrase, str(err.value)), err.value


def test_a_running_variance_that_is_no_tensor_is_refused(tmp_path):
    net, data, fit, checkpoint = _bn_fit(tmp_path)
    saved = fit.save(tmp_path / "fit.pt")
    for path in (saved, checkpoint):
        payload = torch.load(path, weights_only=True)
        payload["model"]["state"]["net.1.running_var"] = "ones"
        files.atomic_save(payload, path)
    with pytest.raises(ValueError, match=r"\['net.1.running_var'\] is a str, not a tensor"):
        zoo.load(saved, model=zoo.models.from_module(net, init="module"))
    with pytest.raises(ValueError, match=r"\['net.1.running_var'\] is a str, not a tensor"):
        zoo.fit(zoo.models.from_module(net, init="module"), "diagonal", data, num_steps=8,
                batch_size=32, run=zoo.Run(progress=False, resume=checkpoint))  # fmt: skip


@pytest.mark.parametrize("kind", ["draws", "laplace", "fit"])
def test_a_model_entry_that_is_no_spec_and_state_is_refused(tmp_path, kind):
    """A re-signed file whose model entry is an empty mapping, and a guide spec whose
    init_scale is a tensor: clear refusals, where the draws and Laplace readers raised
    KeyError('state') and the guide a tensor's truth-value error."""
    torch.manual_seed(0)
    x, y = torch.randn(40, 3), torch.randint(0, 2, (40,))

    def model():
        return zoo.models.BayesianMLP(3, (4,), 2, task="classification")

    fit = zoo.fit(model(), "diagonal", (x, y), num_steps=2, run=zoo.Run(progress=False))
    made = {
        "fit": lambda: fit,
        "draws": lambda: zoo.from_draws(fit.model, fit.sample(4)),
        "laplace": lambda: zoo.laplace(model(), (x, y), num_steps=3, progress=False),
    }[kind]()
    path = made.save(tmp_path / f"{kind}.pt")
    payload = torch.load(path, weights_only=True)
    if kind == "fit":
        payload["guide"]["spec"]["init_scale"] = torch.zeros(2)
        phrase = "init_scale must be a positive number, got tensor"
    else:
        payload["model"] = {}
        phrase = r"the model entry holds \[\], not a model's spec and state"
    files.atomic_save(payload, path)
    with pytest.raises(ValueError, match=phrase):
        zoo.load(path, model=model())
