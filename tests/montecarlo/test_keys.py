"""The Monte-Carlo task-key format: the engine's strings, and the pages' parse of them."""
from __future__ import annotations

import itertools
import re
import uuid

import pytest

from dask_research.montecarlo.keys import BlockKey, block_key, parse_block_key, verify_key

# The regex the Shards page used before keys.py (dashboard/components.py ``_KEY`` at 0a13b29).
_OLD_KEY = re.compile(r"^mc-(?:block|spec|redo|retry\d+)-(?P<prefix>[0-9a-f]+-[0-9a-f]+)-(?P<a>\d+)-(?P<b>\d+)$")


def engine_key(tag: str, a: int, b: int, speculative: bool, tree: bool, retry: int) -> str:
    """The engine's f-strings at 0a13b29 (engine.py ``_submit_leaf``), written out."""
    prefix = "mc-spec" if speculative else ("mc-redo" if not tree else "mc-block")
    if retry:
        prefix = f"mc-retry{retry}"
    return f"{prefix}-{tag}-{a}-{b}"


def _tag() -> str:
    run_id = uuid.uuid4().hex + uuid.uuid4().hex      # a job id: 64 hex digits
    return f"{run_id[:12]}-{uuid.uuid4().hex[:6]}"   # engine.py's tag


@pytest.mark.parametrize("speculative, tree, retry",
                         list(itertools.product([False, True], [True, False], [0, 1, 3, 12])))
def test_block_key_reproduces_the_engine_and_parses_back(speculative, tree, retry):
    tag = _tag()
    for a, b in [(0, 1), (8, 12), (4096, 8192)]:
        key = block_key(tag, a, b, speculative=speculative, tree=tree, retry=retry)
        assert key == engine_key(tag, a, b, speculative, tree, retry)
        parsed = parse_block_key(key)
        assert parsed == BlockKey(key.split("-")[1], tag, a, b)
        assert parsed.shards == range(a, b)
        old = _OLD_KEY.match(key)          # what the page parsed before, it parses the same
        assert old and (old["prefix"], int(old["a"]), int(old["b"])) == (parsed.tag, a, b)


@pytest.mark.parametrize("key", [
    "mc-verify-0123456789ab-abcdef-3", "mc-verify-0123456789ab-abcdef-3-m1", "experiment-h1-1234abcd",
    "mc-block-0123456789ab-abcdef-3", "mc-blocks-0123456789ab-abcdef-0-4", "mc-retry-0123456789ab-abcdef-0-4",
    "mc-block-XYZ-abcdef-0-4", ("mc-block", 1), 7, None,
])
def test_other_keys_are_not_blocks(key):
    assert parse_block_key(key) is None
    if isinstance(key, str):
        assert _OLD_KEY.match(key) is None


def test_verify_key_reproduces_the_engine():
    tag = _tag()
    for s, attempts in [(0, 0), (17, 1), (17, 4)]:
        suffix = f"-m{attempts}" if attempts else ""          # engine.py ``_submit_check``
        assert verify_key(tag, s, attempts) == f"mc-verify-{tag}-{s}{suffix}"
        assert parse_block_key(verify_key(tag, s, attempts)) is None


@pytest.mark.timeout(120, method="thread")
def test_a_run_s_block_keys_parse_with_its_start_event_s_prefix():
    import numpy as np
    from distributed import Client, LocalCluster, get_task_stream

    from dask_research import montecarlo as mc

    job = mc.Job(lambda a: np.sin(a), {"a": mc.Normal(0, 1)}, shards=16, samples_per_shard=256, seed=3, bins=8)
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as cl, \
            Client(cl, set_as_default=False) as c:
        with get_task_stream(client=c) as ts:
            mc.run(job, client=c, shards_per_task=4, verify=1, progress=False)
        start = next(m for _, m in c.get_events("research.montecarlo") if m["event"] == "start")
        keys = [r["key"] for r in ts.data]
    blocks = [parse_block_key(k) for k in keys if k.startswith("mc-block")]
    assert len(blocks) == 4 and all(b is not None and b.tag == start["key_prefix"] for b in blocks)
    assert sorted((b.start, b.stop) for b in blocks) == [(0, 4), (4, 8), (8, 12), (12, 16)]
