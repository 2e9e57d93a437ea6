"""Files that declare more than they hold (zoo.storage.sizes): every loader refuses them, naming
the entry, before torch.load allocates anything; the library's own writer never produces one."""

import collections
import os
import pickletools
import struct
import subprocess
import sys
import textwrap
import zipfile

import pytest
import torch

import zoo
from zoo.models import BayesianMLP
from zoo.storage import files
from zoo.storage.sizes import check_declared, compact


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 3, generator=g)
    data = (x, x[:, 0])
    fit = zoo.fit(
        BayesianMLP(3, (8,), noise=1.0), "diagonal", data, num_steps=3, run=zoo.Run(progress=False)
    )
    folder = tmp_path_factory.mktemp("sizes")
    fit.save(folder / "fit.pt")
    four_steps(data, checkpoint=folder / "ck.pt", checkpoint_every=2)
    return folder, data


def four_steps(data, **run):
    """The checkpointed fit of :func:`fitted` (written, or resumed with ``resume=``)."""
    return zoo.fit(BayesianMLP(3, (8,), noise=1.0), "diagonal", data, num_steps=4, seed=0,
                   run=zoo.Run(progress=False, **run))  # fmt: skip


def hostile(tmp_path, source, change, name="hostile.pt"):
    """The file at ``source`` with ``change(payload)`` applied, written by ``torch.save`` as an
    attacker would (no re-signing: the checksum is never reached)."""
    payload = torch.load(source, weights_only=True)
    change(payload)
    path = tmp_path / name
    torch.save(payload, path)
    return path


class Forged:
    """Pickles as a tensor of ``storage`` at a declared offset, size and stride."""

    def __init__(self, storage, offset, size, stride):
        self.args = (storage, offset, size, stride)

    def __reduce__(self):
        storage, offset, size, stride = self.args
        rebuild = torch._utils._rebuild_tensor_v2
        return rebuild, (storage, offset, size, stride, False, collections.OrderedDict())


def with_storage_numel(path, numel):
    """Rewrite the first storage record's declared element count in ``path``'s pickle (the
    last integer of its persistent id), leaving the record's bytes as they are."""
    with zipfile.ZipFile(path) as archive:
        entries = [(info, archive.read(info)) for info in archive.infolist()]
    out = []
    for info, data in entries:
        if info.filename.endswith("/data.pkl"):
            ops = list(pickletools.genops(data))
            k = next(i for i, (op, _, _) in enumerate(ops) if op.name == "BINPERSID")
            # the element count is the last integer before the persistent id is read
            j = max(i for i in range(k) if ops[i][0].name.startswith(("BININT", "LONG")))
            start, end = ops[j][2], ops[j + 1][2]
            data = data[:start] + b"\x8a\x08" + struct.pack("<q", numel) + data[end:]
        out.append((info, data))
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for info, data in out:
            archive.writestr(info, data)
    return path


def test_an_expanded_entry_is_refused_before_anything_is_allocated(fitted, tmp_path, monkeypatch):
    """One `torch.zeros(1).expand(2**40)` in a 7 KB fit file asked the allocator for 4 TB."""
    folder, _ = fitted
    path = hostile(
        tmp_path,
        folder / "fit.pt",
        lambda p: p["options"].__setitem__("x", torch.zeros(1).expand(2**40)),
    )
    assert path.stat().st_size < 20_000

    def never(*args, **kwargs):
        raise AssertionError("torch.load ran before the sizes were checked")

    monkeypatch.setattr(files.torch, "load", never)
    with pytest.raises(ValueError, match=r"\['options'\]\['x'\] declares 1.1e\+12 elements"):
        zoo.load(path)


@pytest.mark.parametrize(
    "where",
    [
        lambda p: p["guide"]["state"],
        lambda p: p["model"]["state"],
        lambda p: p,
    ],
    ids=["guide state", "model state", "top level"],
)
def test_a_view_larger_than_its_storage_is_refused_naming_the_entry(fitted, tmp_path, where):
    folder, _ = fitted
    path = hostile(
        tmp_path,
        folder / "fit.pt",
        lambda p: where(p).__setitem__("big", torch.zeros(1).expand(1000, 1000)),
    )
    with pytest.raises(
        ValueError, match=r"\['big'\] views 1,000,000 elements .* of a storage of 1"
    ):
        zoo.load(path)


def test_a_checkpoint_given_to_resume_is_checked_the_same_way(fitted, tmp_path):
    folder, data = fitted
    path = hostile(
        tmp_path,
        folder / "ck.pt",
        lambda p: p["options"].__setitem__("y", torch.ones(1).expand(2**33)),
    )
    with pytest.raises(ValueError, match=r"\['options'\]\['y'\] declares 8.59e\+09 elements"):
        four_steps(data, resume=path)


def test_a_storage_declared_past_its_record_is_refused(fitted, tmp_path):
    """The pickle says 2**40 floats, the record holds a few: torch.load would allocate 4 TB
    (under a memory limit the allocator aborts the process)."""
    folder, _ = fitted
    path = with_storage_numel(hostile(tmp_path, folder / "fit.pt", lambda p: None), 2**40)
    with pytest.raises(
        ValueError, match="declares a storage of 4,398,046,511,104 bytes whose record holds"
    ):
        zoo.load(path)


def test_views_past_the_storage_end_and_bad_strides_are_refused(tmp_path):
    storage = torch.zeros(6, dtype=torch.uint8).untyped_storage()  # bytes: one per element
    cases = {
        "offset": (Forged(storage, 4, (3,), (1,)), "views 3 elements"),
        "stride": (Forged(storage, 0, (2, 3), (4, 1)), "views 6 elements .* strides \\[4, 1\\]"),
        "negative": (Forged(storage, 0, (2,), (-1,)), "declares strides \\(-1,\\)"),
        "rank": (Forged(storage, 0, (2, 3), (1,)), "declares strides \\(1,\\)"),
    }
    for name, (forged, message) in cases.items():
        path = tmp_path / f"{name}.pt"
        torch.save({"format": "bnn-zoo", "kind": "fit", "t": forged}, path)
        with pytest.raises(ValueError, match=rf"\['t'\] {message}"):
            check_declared(path)
        with pytest.raises(ValueError, match="no bnn-zoo file holds|no writer produces|declares"):
            zoo.load(path)


def test_tensors_of_forms_no_file_holds_are_refused(tmp_path):
    sparse = torch.sparse_coo_tensor(
        torch.tensor([[0]]), torch.tensor([1.0]), (2**40,), check_invariants=True
    )
    path = tmp_path / "sparse.pt"
    torch.save({"format": "bnn-zoo", "kind": "fit", "t": sparse}, path)
    with pytest.raises(ValueError, match="_rebuild_sparse_tensor, which no bnn-zoo file holds"):
        zoo.load(path)


def test_a_compressed_entry_is_refused_before_it_is_read(fitted, tmp_path):
    folder, _ = fitted
    path = tmp_path / "packed.pt"
    with zipfile.ZipFile(folder / "fit.pt") as src, zipfile.ZipFile(path, "w") as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info), compress_type=zipfile.ZIP_DEFLATED)
    with pytest.raises(ValueError, match="is compressed, which no torch writer does"):
        zoo.load(path)


def test_every_file_the_library_writes_passes_and_expanded_tensors_are_written_whole(
    fitted, tmp_path
):
    folder, _ = fitted
    for name in ("fit.pt", "ck.pt"):
        check_declared(folder / name)
    state = torch.nn.Linear(2, 3).state_dict()
    payload = {"a": torch.arange(3.0).expand(4, 3), "b": [torch.zeros(1).expand(5)], "s": state}
    kept = payload["s"]
    files.atomic_save(payload, tmp_path / "x.pt")
    check_declared(tmp_path / "x.pt")
    back = torch.load(tmp_path / "x.pt", weights_only=True)
    assert torch.equal(back["a"], torch.arange(3.0).expand(4, 3))
    assert back["s"]._metadata == state._metadata
    assert compact(payload)["s"] is kept  # nothing in it replaced: the same object
    assert payload["a"].stride() == (0, 1)  # the caller's payload is left alone


@pytest.mark.slow  # runs child processes: the full tier
def test_a_hostile_file_is_refused_under_a_memory_limit(fitted, tmp_path):
    """In a process whose address space is its use at start plus 1 GiB, a file whose entry
    views 3.6 GB of one float is refused with the clear error (the copy would not fit)."""
    folder, _ = fitted
    path = hostile(
        tmp_path,
        folder / "fit.pt",
        lambda p: p["options"].__setitem__("x", torch.zeros(1).expand(900_000_000)),
    )
    script = textwrap.dedent(
        f"""
        import resource, zoo
        with open("/proc/self/statm") as f:
            size = int(f.read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (size + 2**30, size + 2**30))
        try:
            zoo.load({str(path)!r})
        except ValueError as err:
            print("refused:", err)
        """
    )
    if not os.path.exists("/proc/self/statm"):
        pytest.skip("needs /proc to read the process's size")
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "refused:" in done.stdout and "views 900,000,000 elements" in done.stdout


def test_a_nest_sharing_one_list_at_every_level_is_read_in_linear_time(fitted, tmp_path):
    """A pickle's memo lets 48 levels of ``[inner, inner]`` hold 2**48 paths in a few hundred
    bytes; the check visits each object once and then refuses the tensor at the bottom (run in
    a child with a deadline, so that a regression fails instead of hanging)."""
    folder, _ = fitted

    def nest(payload):
        inner = [torch.zeros(1).expand(10)]
        for _ in range(48):
            inner = [inner, inner]
        payload["options"]["nest"] = inner

    path = hostile(tmp_path, folder / "fit.pt", nest)
    script = f"import zoo; from zoo.storage.sizes import check_declared\n" \
             f"check_declared({str(path)!r})"  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1
    assert "['nest'][0][0]" in done.stderr and "views 10 elements" in done.stderr
