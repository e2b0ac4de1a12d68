"""Placement on CPU: three tiers of different declared bandwidths (host, a host stand-in for
the device, disk). The hottest transitions live in the fastest tier they fit in."""
import time

import numpy as np
import pytest
from replay_helpers import CARTPOLE, make_batch

from dask_research.replay import DiskTier, ExperiencePlane, HostTier, PrioritizedSampler, RecentSampler
from dask_research.replay.tier_placement import desired_tiers

ITEM = 48     # aligned CartPole record


def _tiers(tmp_path):
    # deliberately not in bandwidth order: placement must sort them
    return [DiskTier(tmp_path, 40 * ITEM, bandwidth=0.5e9),
            HostTier(10 * ITEM, bandwidth=20e9, name="device"),     # stands in for the GPU
            HostTier(20 * ITEM, bandwidth=8e9, name="host")]


def _tier_keys(plane):
    ts = plane.storage
    slots, keys = plane.ring.stored()
    return [set(keys[ts.tier_of[slots] == k].tolist()) for k in range(len(ts.storages))]


def test_recency_newest_in_the_fastest_tier(tmp_path):
    plane = ExperiencePlane(CARTPOLE, tiers=_tiers(tmp_path), migrate="manual", seed=0)
    assert plane.capacity == 70
    assert [t.name for t in plane.storage.tiers] == ["device", "host", "disk"]
    for start in range(0, 130, 13):
        plane.ingest(make_batch(13, start=start))
    moved = plane.rebalance()
    assert moved > 0
    dev, host, disk = _tier_keys(plane)
    assert dev == set(range(120, 130))
    assert host == set(range(100, 120))
    assert disk == set(range(60, 100))
    assert plane.rebalance() == 0                      # stable: nothing left to move
    # data is intact after the moves
    np.testing.assert_array_equal(plane.contents()["action"], np.arange(60, 130))
    b = plane.sample(200)
    np.testing.assert_array_equal(b.action, b.indices)
    plane.close()


def test_priority_highest_in_the_fastest_tier(tmp_path):
    plane = ExperiencePlane(CARTPOLE, tiers=_tiers(tmp_path), migrate="manual", seed=0,
                            sampler=PrioritizedSampler(alpha=1.0, beta=0.5, eps=0.0))
    plane.ingest(make_batch(70))
    rng = np.random.default_rng(1)
    pr = rng.permutation(70).astype(float) + 1.0        # distinct priorities 1..70
    plane.update_priorities(np.arange(70), pr)
    plane.rebalance()
    dev, host, disk = _tier_keys(plane)
    order = np.argsort(-pr)
    assert dev == set(order[:10].tolist())
    assert host == set(order[10:30].tolist())
    assert disk == set(order[30:].tolist())
    report = plane.placement()
    assert report.policy == "priority" and report.misplaced == 0
    shares = [t.sample_share for t in report.tiers]
    np.testing.assert_allclose(shares[0], np.sort(pr)[-10:].sum() / pr.sum())
    # priorities change: the report notices, a rebalance fixes it
    plane.update_priorities(order[:10], np.full(10, 0.5))
    assert plane.placement().misplaced > 0
    plane.rebalance()
    assert _tier_keys(plane)[0] == set(order[10:20].tolist())
    plane.close()


def test_background_migration(tmp_path):
    plane = ExperiencePlane(CARTPOLE, tiers=_tiers(tmp_path), seed=0, migrate_interval=0.01)
    for start in range(0, 100, 10):
        plane.ingest(make_batch(10, start=start))
    deadline = time.monotonic() + 10
    while plane.placement().misplaced and time.monotonic() < deadline:
        time.sleep(0.02)
    assert plane.placement().misplaced == 0
    assert _tier_keys(plane)[0] == set(range(90, 100))
    assert plane.stats()["migrated"] > 0
    plane.close()


def test_placement_report_explains(tmp_path):
    plane = ExperiencePlane(CARTPOLE, tiers=_tiers(tmp_path), migrate="manual",
                            sampler=RecentSampler(window=10))
    plane.ingest(make_batch(70))
    plane.rebalance()
    text = str(plane.placement())
    assert "newest transitions in the fastest tier" in text
    assert "device" in text and "20.00 GB/s" in text
    rep = plane.placement()
    assert [t.used for t in rep.tiers] == [10, 20, 40]
    # Transitions held of those it can hold, then the bytes they take of the tier's bytes.
    from dask.utils import format_bytes

    for t in rep.tiers:
        held = format_bytes(t.capacity_bytes * t.used // t.rows)
        assert f"{t.used:,} of {t.rows:,} ({held} of {format_bytes(t.capacity_bytes)})" in text, text
    assert rep.tiers[0].sample_share == pytest.approx(1.0)       # the window is all on 'device'
    plane.close()


def test_placement_table_stars_only_measured_bandwidths(tmp_path):
    """No "nan GB/s" for a plane without tiers, and the "(* = measured)" note only when a row
    carries a star."""
    plain = ExperiencePlane(CARTPOLE, capacity=100)
    plain.ingest(make_batch(10))
    text = str(plain.placement())
    assert "nan" not in text and "*" not in text
    declared = ExperiencePlane(CARTPOLE, tiers=_tiers(tmp_path), migrate="manual")
    declared.ingest(make_batch(10))
    assert "measured" not in str(declared.placement())
    measured = ExperiencePlane(CARTPOLE, capacity=100, migrate="manual",
                               tiers=[HostTier("1KiB", bandwidth=1e10), DiskTier(tmp_path / "m")])
    measured.ingest(make_batch(10))
    assert "GB/s*" in str(measured.placement()) and "(* = measured bandwidth)" in str(measured.placement())
    for p in (plain, declared, measured):
        p.close()


def test_single_host_tier_report():
    plane = ExperiencePlane(CARTPOLE, capacity=10)
    plane.ingest(make_batch(4))
    rep = plane.placement()
    assert len(rep.tiers) == 1 and rep.tiers[0].used == 4 and "one host tier" in rep.reason


def test_ties_keep_their_tier():
    heat = np.ones(6)
    current = np.array([2, 2, 1, 0, 0, 1], dtype=np.int8)
    np.testing.assert_array_equal(desired_tiers(heat, current, [2, 2, 2]), current)
    np.testing.assert_array_equal(desired_tiers(np.arange(6.0), current, [2, 2, 2]),
                                  [2, 2, 1, 1, 0, 0])


def test_bounded_rounds_converge_within_capacity(tmp_path):
    plane = ExperiencePlane(CARTPOLE, tiers=_tiers(tmp_path), migrate="manual", seed=0,
                            sampler=PrioritizedSampler(alpha=1.0, beta=0.5, eps=0.0))
    plane.ingest(make_batch(70))
    plane.rebalance()
    pr = np.random.default_rng(2).random(70) + 0.1
    plane.update_priorities(np.arange(70), pr)
    sizes = []
    while plane.placement().misplaced:
        moved = plane.rebalance(max_moves=4)
        assert moved > 0, "a round with misplaced transitions must make progress"
        sizes.append(moved)
        occ = plane.storage.occupancy()
        assert all(u <= s.rows for u, s in zip(occ, plane.storage.storages))
        assert len(sizes) < 200
    assert len(sizes) > 1 and max(sizes) < 40      # bounded rounds, not the whole plan at once
    assert _tier_keys(plane)[0] == set(np.argsort(-pr)[:10].tolist())
    np.testing.assert_array_equal(plane.contents()["action"], np.arange(70))


def test_rebalance_skips_transitions_overwritten_meanwhile(tmp_path):
    plane = ExperiencePlane(CARTPOLE, tiers=_tiers(tmp_path), migrate="manual", seed=0)
    plane.ingest(make_batch(70))
    with plane._lock:
        slots, keys = plane.ring.stored()
        heat = plane.sampler.heat(slots, keys)
        current = plane.storage.tier_of[slots]
    plane.ingest(make_batch(30, start=70))         # the plan's oldest 30 are gone
    moved = plane._placement.rebalance(slots, keys, heat, current, plane._lock, plane.ring.valid)
    assert moved >= 0
    occ = plane.storage.occupancy()
    assert all(u <= s.rows for u, s in zip(occ, plane.storage.storages))
    np.testing.assert_array_equal(plane.contents()["action"], np.arange(30, 100))
    plane.rebalance()
    assert plane.placement().misplaced == 0
