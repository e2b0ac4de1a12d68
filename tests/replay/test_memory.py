"""A plane's resident memory follows what it stores, not what its tiers declare (issue 29).

Each case runs in a fresh ``python`` subprocess that measures its own RSS (psutil) before the
plane is built and after it is filled: a bound on bytes, which holds at any speed. The bound is
1.1 x the bytes the stored transitions need (records, plus the tier location map's 9 bytes per
transition when there are tiers) plus a fixed 16 MiB (the allocator's arena, ingest batch
temporaries, the bandwidth probe).
"""
import pytest

from dask_research.testing.processes import run_python

FIXED = 16 * 2**20
INDEX = 9          # bytes per stored transition of a TieredStorage's location map

PROBE = """
import sys, tempfile, numpy as np, psutil
from dask_research import replay
SPEC = {"obs": ((4,), "float32"), "action": ((), "int64"), "reward": ((), "float32"),
        "next_obs": ((4,), "float32"), "done": ((), "bool")}
tier, capacity, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
proc = psutil.Process()
m = 50_000
b = {"obs": np.ones((m, 4), np.float32), "action": np.ones(m, np.int64),
     "reward": np.ones(m, np.float32), "next_obs": np.ones((m, 4), np.float32),
     "done": np.zeros(m, bool)}
base = proc.memory_info().rss
if tier == "none":
    plane = replay.ExperiencePlane(SPEC, capacity=capacity)
else:
    plane = replay.ExperiencePlane(SPEC, capacity=capacity, migrate="manual",
                                   tiers=[replay.HostTier(tier, bandwidth=1e10),
                                          replay.DiskTier(tempfile.mkdtemp(), bandwidth=1e9)])
done = 0
while done < n:
    k = min(m, n - done)
    plane.ingest({f: v[:k] for f, v in b.items()})
    done += k
print(plane.spec.itemsize, len(plane), proc.memory_info().rss - base)
"""


@pytest.mark.parametrize("tier, capacity, n", [
    # a quarter full: RSS of a quarter, not of the capacity
    pytest.param("none", 2_000_000, 500_000, marks=pytest.mark.slow),
    ("512MiB", 1_000_000, 500_000),        # a tier far larger than the plane's capacity (the cheap one)
    # the replay page's headline plane, on the host, full
    pytest.param("16GiB", 1_000_000, 1_000_000, marks=pytest.mark.slow),
])
def test_rss_follows_stored_transitions(tmp_path, tier, capacity, n):
    r = run_python(PROBE, tmp_path, tier, str(capacity), str(n), timeout=120)
    assert r.returncode == 0, r.stderr
    itemsize, size, rss = map(int, r.stdout.split())
    assert size == n
    need = n * (itemsize + (0 if tier == "none" else INDEX))
    assert rss <= 1.1 * need + FIXED, (f"RSS grew by {rss / 2**20:.1f} MiB for {n:,} transitions "
                                       f"needing {need / 2**20:.1f} MiB")


def test_a_tier_is_an_upper_bound(tmp_path):
    """A tier larger than the plane's capacity holds at most the capacity (no 5.6M rows for
    a 1,000-transition plane)."""
    from dask_research import replay

    plane = replay.ExperiencePlane({"x": ((4,), "float32")}, capacity=1_000,
                                   tiers=[replay.HostTier("256MiB"), replay.DiskTier(tmp_path)])
    try:
        assert [s.rows for s in plane.storage.storages] == [1_000, 1]
        assert plane.capacity == 1_000
    finally:
        plane.close()
