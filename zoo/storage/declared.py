"""What a pickled file says it is, read without unpickling it (:func:`declared`).

Fit files of format 1 were pickled objects; ``zoo.load(path, allow_pickle=True)`` unpickles
them, which runs code from the file. No other kind of file was ever pickled, so before
anything is unpickled the file's own header is read from its pickle *opcodes*
(:mod:`pickletools`, which parses and never executes): the leading entries of the top-level
dict, ``{"format": "bnn-zoo", "version": 1, "kind": "fit", ...}`` in every file the library
wrote. A file that declares anything else is refused before it can run code.
"""

from __future__ import annotations

import os
import pickletools
import zipfile

#: Opcodes that push a string or a number: the header's values.
_STRINGS = {
    "SHORT_BINUNICODE",
    "BINUNICODE",
    "BINUNICODE8",
    "UNICODE",
    "SHORT_BINSTRING",
    "BINSTRING",
    "STRING",
}
_NUMBERS = {"BININT", "BININT1", "BININT2", "INT", "LONG", "LONG1", "LONG4"}
_MEMO_WRITE = {"BINPUT", "LONG_BINPUT", "PUT", "MEMOIZE"}
_MEMO_READ = {"BINGET", "LONG_BINGET", "GET"}
#: The most opcodes read for the header: it is the top-level dict's first entries.
_HEADER_OPCODES = 64


def declared(path: str | os.PathLike) -> dict:
    """The leading plain entries (strings and numbers) of the top-level dict pickled in the
    torch file at ``path``, read from its opcodes without unpickling anything; ``{}`` when the
    file is not a torch zip archive with one pickle, or its pickle does not start with a
    dict."""
    try:
        with zipfile.ZipFile(path) as archive:
            pickles = [n for n in archive.namelist() if n.endswith("/data.pkl")]
            if len(pickles) != 1:
                return {}
            data = archive.read(pickles[0])
    except (OSError, zipfile.BadZipFile, KeyError, ValueError):
        return {}
    return _header(data)


def _header(data: bytes) -> dict:
    header: dict = {}
    memo: dict = {}
    expect = ["PROTO", "EMPTY_DICT", "MARK"]  # the top-level dict, then its items
    key, last = None, None
    try:
        for count, (op, arg, _) in enumerate(pickletools.genops(data)):
            name = op.name
            if count >= _HEADER_OPCODES:
                break
            if name in _MEMO_WRITE:  # stores the value on top of the stack
                memo[len(memo) if name == "MEMOIZE" else arg] = last
                continue
            if expect:
                if name != expect.pop(0):
                    return {}
                last = None
                continue
            if name in _MEMO_READ:
                value = memo.get(arg)
            elif name in _STRINGS or name in _NUMBERS:
                value = arg
            else:
                break  # the first entry that is not plain data ends the header
            last = value
            if key is None:
                if not isinstance(value, str):
                    break
                key = value
            else:
                header[key], key = value, None
    except (ValueError, IndexError, EOFError):  # opcodes that do not parse
        return {}
    return header
