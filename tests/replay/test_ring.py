"""The Ring (keys, cursor, validity, eviction) against a brute-force model of the ring."""
import numpy as np
import pytest

from dask_research.replay.ring import Ring


def _model(capacity, ops):
    """Keys stored (oldest first) and total, replaying ``ops`` by hand."""
    keys, total = [], 0
    for op, n in ops:
        if op == "insert":
            keys += list(range(total, total + n))
            total += n
            keys = keys[-capacity:]
        elif op == "skip":
            total += n
        else:                                   # evict
            keys = keys[n:]
    return keys, total


@pytest.mark.parametrize("seed", range(20))
def test_ring_matches_a_model(seed):
    rng = np.random.default_rng(seed)
    cap = int(rng.integers(1, 12))
    ring, ops = Ring(cap), []
    for _ in range(30):
        kind = rng.choice(["insert", "insert", "evict", "skip"])
        n = int(rng.integers(0, cap + 1))
        if kind == "insert":
            segs = ring.segments(n)
            assert sum(c for _, _, c in segs) == n and len(segs) <= 2
            assert [o for _, o, _ in segs] == [0, segs[0][2]][:len(segs)]
            assert all(0 <= s and s + c <= cap for s, _, c in segs)
            assert segs[0][0] == ring.cursor
            ring.advance(n)
        elif kind == "skip":
            ring.skip(n)
            # skipping is only ever followed by an insert that refills the ring (ingest of
            # a batch larger than the ring): mirror that
            ring.advance(cap)
            ops.append(("skip", n))
            kind, n = "insert", cap
        else:
            slots, keys = ring.evict_oldest(n)
            assert (slots == keys % cap).all()
        ops.append((kind, n))
        want, total = _model(cap, ops)
        slots, keys = ring.stored()
        assert keys.tolist() == want and ring.total == total and ring.size == len(want)
        assert (slots == keys % cap).all() and ring.first == total - len(want)
        assert (ring.keys(slots) == keys).all()
        probe = np.arange(total - cap - 2, total + 3)
        assert ring.valid(probe).tolist() == [k in want for k in probe]
        assert ring.newest(2).tolist() == [total - 2, total - 1]


def test_reset_and_repr():
    r = Ring(4)
    r.advance(6)
    r.reset(10)
    assert (r.total, r.size, r.cursor) == (10, 0, 2) and r.stored()[1].tolist() == []
    assert repr(r) == "Ring(capacity=4, total=10, size=0)"
    assert r.evict_oldest(3)[0].tolist() == []
