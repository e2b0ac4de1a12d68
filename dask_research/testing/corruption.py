"""Damage files the way disks, networks and attackers do: for fuzzing what reads them.

The fuzz tests of the run store, the experiments journal and the replay checkpoint share these
byte-level mutations and the strategy for arbitrary JSON values. Requires ``hypothesis``.

Examples
--------
>>> import random
>>> from dask_research.testing.corruption import flip_bit, truncate
>>> rnd = random.Random(0)
>>> len(truncate(b"abcdef", rnd)) < 6
True
>>> flipped = flip_bit(b"abcdef", rnd)
>>> sum(x != y for x, y in zip(flipped, b"abcdef"))
1
"""
from __future__ import annotations

import json
import pathlib
import random
from typing import Any

from hypothesis import strategies as st

__all__ = ["flip_bit", "json_values", "mutate", "truncate"]


def truncate(raw: bytes, rnd: random.Random) -> bytes:
    """``raw`` cut at a random point (possibly empty, never whole)."""
    return raw[: rnd.randrange(len(raw))]


def flip_bit(raw: bytes, rnd: random.Random) -> bytes:
    """``raw`` with one random bit inverted."""
    i = rnd.randrange(len(raw))
    return raw[:i] + bytes([raw[i] ^ (1 << rnd.randrange(8))]) + raw[i + 1:]


def mutate(path: pathlib.Path, how: str, rnd: random.Random, value: Any) -> bool:
    """Damage the file at ``path`` the file-level ways (``truncate``, ``bitflip``, ``replace``
    with ``value`` as JSON, ``delete``); ``False`` for any other ``how`` (the caller's own)."""
    if how == "truncate":
        path.write_bytes(truncate(path.read_bytes(), rnd))
    elif how == "bitflip":
        path.write_bytes(flip_bit(path.read_bytes(), rnd))
    elif how == "replace":
        path.write_text(json.dumps(value))
    elif how == "delete":
        path.unlink()
    else:
        return False
    return True


def json_values(max_int: int = 2**40, allow_nan: bool = True, max_text: int = 10,
                max_size: int = 3, max_key: int = 6, max_leaves: int = 8) -> st.SearchStrategy:
    """Arbitrary JSON-like values: scalars, and lists and dicts of them."""
    scalars = (st.none() | st.booleans() | st.integers(-max_int, max_int)
               | st.floats(allow_nan=allow_nan) | st.text(max_size=max_text))
    return st.recursive(scalars,
                        lambda c: st.lists(c, max_size=max_size)
                        | st.dictionaries(st.text(max_size=max_key), c, max_size=max_size),
                        max_leaves=max_leaves)
