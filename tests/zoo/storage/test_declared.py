"""Pickled files: their declared kind read from the opcodes, and every kind but a fit of format
1 refused before anything is unpickled, under any flag."""

from pathlib import Path

import pytest
import torch

import zoo
from zoo.storage.declared import declared

LEGACY = Path(__file__).resolve().parents[2] / "data" / "legacy_v1"


class Payload:
    """Unpickling this writes a marker file: the code a hostile file runs."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "ran"))


def _hostile(tmp_path, **header) -> tuple[Path, Path]:
    marker = tmp_path / "marker"
    path = tmp_path / "hostile.pt"
    torch.save({**header, "payload": Payload(marker)}, path)
    return path, marker


def test_the_header_of_a_format_1_fit_is_read_without_unpickling():
    assert declared(LEGACY / "diagonal.pt") == {"format": "bnn-zoo", "version": 1, "kind": "fit"}


@pytest.mark.parametrize(
    "header",
    [
        {"format": "bnn-zoo", "version": 3, "kind": "draws"},
        {"format": "bnn-zoo", "version": 3, "kind": "fit"},
        {"format": "bnn-zoo", "version": 1, "kind": "laplace"},
        {"format": "other", "version": 1, "kind": "fit"},
        {},
    ],
    ids=["draws-v3", "fit-v3", "laplace-v1", "other-format", "no-header"],
)
def test_a_pickled_file_of_any_other_kind_is_refused_and_runs_nothing(tmp_path, header):
    path, marker = _hostile(tmp_path, **header)
    for allow in (False, True):
        with pytest.raises(ValueError, match="no fit file of bnn-zoo's format 1.*refused"):
            zoo.load(path, allow_pickle=allow)
    assert not marker.exists()


def test_the_refusal_of_an_old_fit_names_the_flag_for_old_fit_files_only(tmp_path):
    path, marker = _hostile(tmp_path, format="bnn-zoo", version=1, kind="fit")
    with pytest.raises(ValueError, match="a fit file of bnn-zoo's format 1.*allow_pickle=True"):
        zoo.load(path)
    assert not marker.exists()


def test_not_a_torch_archive_declares_nothing(tmp_path):
    path = tmp_path / "plain.bin"
    path.write_bytes(b"\x80\x02}q\x00.")  # a bare pickle, not a torch zip archive
    assert declared(path) == {} and declared(tmp_path / "missing.pt") == {}
