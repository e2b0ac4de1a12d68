"""The Dask task keys of a Monte-Carlo run: one format, written by the engine, read by the pages.

A block of shards ``[start, stop)`` of the run tagged ``tag`` (the run id's first 12 hex
digits and a 6-digit nonce) runs under ``mc-<kind>-<tag>-<start>-<stop>``, where the kind says
why it was submitted: ``block`` (the fixed tree's leaf), ``redo`` (a leaf recomputed without
the tree), ``spec`` (a speculative copy of a slow block), ``retry<N>`` (the N-th resubmission
after a failure). Distinct keys for copies of one block keep Dask from handing back a cached
value. A verification of shard ``s`` runs under ``mc-verify-<tag>-<s>``, ``-m<N>`` appended when it
was moved after N tries. The task that hands the client a group of blocks' results in one
message (:mod:`.groups`) runs under ``mc-group-<tag>-<start>-<stop>``, the shards of its blocks;
it computes nothing, and :func:`parse_block_key` does not read it as a block.

Examples
--------
>>> from dask_research.montecarlo.keys import block_key, parse_block_key
>>> block_key("0123abcd4567-89abcd", 8, 12)
'mc-block-0123abcd4567-89abcd-8-12'
>>> parse_block_key("mc-retry2-0123abcd4567-89abcd-8-12")
BlockKey(kind='retry2', tag='0123abcd4567-89abcd', start=8, stop=12)
"""
from __future__ import annotations

import re
from typing import NamedTuple

__all__ = ["BlockKey", "block_key", "group_key", "parse_block_key", "verify_key"]

_BLOCK = re.compile(r"^mc-(?P<kind>block|spec|redo|retry\d+)-(?P<tag>[0-9a-f]+-[0-9a-f]+)"
                    r"-(?P<start>\d+)-(?P<stop>\d+)$")


class BlockKey(NamedTuple):
    """What a block task's key says: why it ran, the run's tag, its shards ``[start, stop)``.

    >>> BlockKey("spec", "ab-cd", 0, 4).shards
    range(0, 4)
    """

    kind: str
    tag: str
    start: int
    stop: int

    @property
    def shards(self) -> range:
        return range(self.start, self.stop)


def block_key(tag: str, start: int, stop: int, *, speculative: bool = False, tree: bool = True,
              retry: int = 0) -> str:
    """The key of block ``[start, stop)``: ``mc-block``, ``mc-redo`` (no tree), ``mc-spec``
    (speculative), or ``mc-retry<N>`` (resubmitted, whatever else holds).

    >>> block_key("ab-cd", 0, 4, speculative=True), block_key("ab-cd", 0, 4, tree=False)
    ('mc-spec-ab-cd-0-4', 'mc-redo-ab-cd-0-4')
    >>> block_key("ab-cd", 0, 4, speculative=True, retry=1)
    'mc-retry1-ab-cd-0-4'
    """
    kind = "spec" if speculative else ("redo" if not tree else "block")
    if retry:
        kind = f"retry{retry}"
    return f"mc-{kind}-{tag}-{start}-{stop}"


def group_key(tag: str, start: int, stop: int) -> str:
    """The key of the task that collects the results of the blocks covering ``[start, stop)``.

    >>> group_key("ab-cd", 0, 32), parse_block_key(group_key("ab-cd", 0, 32)) is None
    ('mc-group-ab-cd-0-32', True)
    """
    return f"mc-group-{tag}-{start}-{stop}"


def parse_block_key(key: object) -> BlockKey | None:
    """The parts of a block task's key, or None for any other key.

    >>> parse_block_key("mc-verify-ab-cd-3") is None, parse_block_key(("tuple", 1)) is None
    (True, True)
    """
    if not isinstance(key, str):
        return None
    m = _BLOCK.match(key)
    if m is None:
        return None
    return BlockKey(m["kind"], m["tag"], int(m["start"]), int(m["stop"]))


def verify_key(tag: str, shard: int, attempt: int = 0) -> str:
    """The key of the verification of ``shard``; a check moved after ``attempt`` earlier
    tries carries ``-m<attempt>``.

    >>> verify_key("ab-cd", 3), verify_key("ab-cd", 3, attempt=1)
    ('mc-verify-ab-cd-3', 'mc-verify-ab-cd-3-m1')
    """
    return f"mc-verify-{tag}-{shard}" + (f"-m{attempt}" if attempt else "")
