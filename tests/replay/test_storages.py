"""Storages behave alike (host, disk, device through ``xp``); tiers never exceed capacity."""
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from replay_helpers import CARTPOLE, make_batch

from dask_research.exceptions import CapacityError, InputError
from dask_research.replay import (
    DeviceStorage,
    DeviceTier,
    DiskStorage,
    DiskTier,
    ExperiencePlane,
    ExperienceSpec,
    HostStorage,
    HostTier,
    TieredStorage,
)

SPEC = ExperienceSpec(CARTPOLE)


@pytest.fixture(params=["host", "disk", "device"])
def storage(request, tmp_path, xp):
    if request.param == "host":
        if xp is not np:
            pytest.skip("host storage is numpy only")
        s = HostStorage(SPEC, 64)
    elif request.param == "disk":
        if xp is not np:
            pytest.skip("disk storage is numpy only")
        s = DiskStorage(SPEC, 64, tmp_path)
    else:
        s = DeviceStorage(SPEC, 64, xp=xp)
    yield s
    s.close()


def _records(batch):
    fields, _ = SPEC.validate(batch)
    return SPEC.pack(fields)


def test_write_fields_then_read_records(storage):
    b = make_batch(20)
    storage.write_fields(10, SPEC.validate(b)[0])
    rows = np.array([29, 10, 15, 15])
    out = SPEC.empty(4)
    storage.read_records(rows, out)
    for name in SPEC.names:
        np.testing.assert_array_equal(out[name], b[name][rows - 10])


def test_write_records_at_arbitrary_rows(storage):
    rec = _records(make_batch(5, start=50))
    rows = np.array([63, 0, 7, 8, 31])
    storage.write_records(rows, rec)
    out = SPEC.empty(5)
    storage.read_records(rows[::-1].copy(), out)
    np.testing.assert_array_equal(out["action"], rec["action"][::-1])
    np.testing.assert_array_equal(out["obs"], rec["obs"][::-1])


def test_bandwidth_is_measured_and_positive(storage):
    assert storage.measure_bandwidth(probe_rows=64, repeat=1) > 0
    assert storage.nbytes == 64 * SPEC.itemsize


def test_device_field_views_are_typed_views(xp):
    from dask_research.replay.storages.device import field_views

    s = DeviceStorage(SPEC, 8, xp=xp)
    b = make_batch(8)
    s.write_fields(0, SPEC.validate(b)[0])
    views = field_views(SPEC, s.gather(np.arange(8)), xp)
    got = views["obs"] if xp is np else views["obs"].get()
    np.testing.assert_array_equal(got, b["obs"])


def test_disk_storage_removes_its_file(tmp_path):
    s = DiskStorage(SPEC, 4, tmp_path)
    assert s.file.exists()
    s.close()
    assert not s.file.exists()


def test_tier_capacities_parse_bytes_and_sum(tmp_path):
    item = SPEC.itemsize
    ts = TieredStorage(SPEC, [HostTier("1KiB", bandwidth=2e9), HostTier(10 * item, bandwidth=1e9,
                                                                        name="h2")])
    assert [s.rows for s in ts.storages] == [1024 // item, 10]
    assert ts.capacity == 1024 // item + 10
    ts.close()
    with pytest.raises(CapacityError, match="needs .* bytes but only .* are available"):
        TieredStorage(SPEC, [HostTier(10 * item)], capacity=11)
    with pytest.raises(CapacityError, match="tier 'host'"):
        TieredStorage(SPEC, [HostTier(item - 1)])
    with pytest.raises(InputError, match="capacity='lots' is invalid"):
        HostTier("lots")
    with pytest.raises(InputError, match="distinct names"):
        TieredStorage(SPEC, [HostTier("1KiB"), HostTier("1KiB")])
    with pytest.raises(InputError, match="no byte capacity"):
        TieredStorage(SPEC, [HostTier("1KiB"), DiskTier(tmp_path)])


def test_unbounded_disk_tier_takes_the_rest(tmp_path):
    item = SPEC.itemsize
    ts = TieredStorage(SPEC, [HostTier(10 * item, bandwidth=1e10), DiskTier(tmp_path, bandwidth=1e8)],
                       capacity=25)
    assert [s.rows for s in ts.storages] == [10, 15] and ts.capacity == 25
    ts.close()


def test_tiers_are_ordered_by_bandwidth(tmp_path):
    ts = TieredStorage(SPEC, [DiskTier(tmp_path, "1KiB", bandwidth=1e8),
                              HostTier("1KiB", bandwidth=1e10, name="fast"),
                              DeviceTier("1KiB", bandwidth=5e9, name="dev", xp=np)])
    assert [t.name for t in ts.tiers] == ["fast", "dev", "disk"]
    ts.close()


@settings(max_examples=30, deadline=None)
@given(caps=st.lists(st.integers(1, 12), min_size=1, max_size=3),
       sizes=st.lists(st.integers(1, 50), min_size=1, max_size=8),
       rebalance=st.booleans())
def test_a_tier_never_exceeds_its_capacity(tmp_path_factory, caps, sizes, rebalance):
    item = SPEC.itemsize
    tmp = tmp_path_factory.mktemp("tiers")
    tiers = [HostTier(c * item + (item - 1), bandwidth=1e9 * (i + 1), name=f"h{i}")
             for i, c in enumerate(caps[:-1])]
    tiers.append(DiskTier(tmp, caps[-1] * item, bandwidth=1e6))
    plane = ExperiencePlane(CARTPOLE, tiers=tiers, migrate="manual", seed=0)
    assert plane.capacity == sum(caps)
    start = 0
    for n in sizes:
        n = min(n, plane.capacity)            # a larger batch is refused (tested in test_spec)
        plane.ingest(make_batch(n, start=start))
        start += n
        if rebalance:
            plane.rebalance()
        occ = plane.storage.occupancy()
        for t, s, used in zip(plane.storage.tiers, plane.storage.storages, occ):
            assert used <= s.rows and s.rows * item <= t.capacity
        assert sum(occ) == len(plane)
    np.testing.assert_array_equal(plane.contents()["action"],
                                  np.arange(start)[-plane.capacity:])
    plane.close()


def test_a_plane_refused_after_its_tiers_were_built_leaves_no_disk_file(tmp_path):
    """A tier that cannot be built, or bad input checked after the tiers (a seed), used to
    leave the disk tier's ``.records`` file behind."""
    with pytest.raises(CapacityError, match="host tier"):
        ExperiencePlane(CARTPOLE, tiers=[DiskTier(tmp_path, "1MiB", bandwidth=1e9),
                                         HostTier(2**62, bandwidth=1e10)])
    with pytest.raises(InputError, match="seed='abc' is invalid"):
        ExperiencePlane(CARTPOLE, tiers=[DiskTier(tmp_path, "1MiB", bandwidth=1e9)], seed="abc")
    with pytest.raises(InputError, match="publish_interval=-1 is invalid"):
        ExperiencePlane(CARTPOLE, tiers=[DiskTier(tmp_path, "1MiB", bandwidth=1e9)],
                        client=object(), publish_interval=-1)
    assert list(tmp_path.iterdir()) == []


def test_disk_tier_paths_that_cannot_hold_its_file_are_refused_in_one_line(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("")
    for bad in (afile, afile / "sub"):
        with pytest.raises(InputError, match=r"disk tier 'disk': path=.* is invalid; expected a "
                                             r"directory this process can create files in \("):
            DiskStorage(SPEC, 4, bad)
    with pytest.raises(InputError, match="DiskTier 'disk': path=None is invalid"):
        DiskTier(None)
    assert [p.name for p in tmp_path.iterdir()] == ["afile"]


def test_disk_tier_larger_than_the_free_space_is_refused(tmp_path):
    """Its sparse file would outgrow the disk during ingest, and the process die of SIGBUS."""
    import shutil

    rows = 2 * shutil.disk_usage(tmp_path).free // SPEC.itemsize + 1
    with pytest.raises(CapacityError, match=r"disk tier 'disk' of .* transitions under .* needs"):
        DiskStorage(SPEC, rows, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_disk_tier_maps_the_file_it_created_not_a_link_put_in_its_place(tmp_path, monkeypatch):
    """Whoever can write to a shared tier directory may swap the fresh file for a symbolic link
    before it is mapped; the tier used to reopen it by name, truncating the link's target."""
    import tempfile

    from dask_research.replay.storages import disk

    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    shared = tmp_path / "shared"
    real = tempfile.mkstemp

    def racing_mkstemp(*args, **kwargs):
        fd, name = real(*args, **kwargs)
        os.unlink(name)                          # the other user wins the race
        os.symlink(victim, name)
        return fd, name

    monkeypatch.setattr(disk.tempfile, "mkstemp", racing_mkstemp)
    s = DiskStorage(SPEC, 4, shared, keep=True)
    s.write_fields(0, {"reward": np.ones(4, np.float32)})
    s.close()
    assert victim.read_bytes() == b"precious"
