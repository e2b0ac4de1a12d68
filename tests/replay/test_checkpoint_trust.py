"""Replay checkpoints and planes written by someone hostile or careless (issue 25), on real files.

Each case failed before: restored counters near 2**63 were accepted (the next ingest overflowed),
priorities whose sum overflows float64 were accepted live and restored (every draw then landed
on the last slot), a 2 MiB data.npz with an extra compressed array made a restore allocate
gigabytes (and unknown arrays were accepted), all-zero priorities restored and failed only at
the first sample, object priorities raised a raw AttributeError, and ``sample(10**9)`` tried to
allocate 7.45 GiB. Every refusal is one line of the capability's own error type naming the file
(restores) or the bad value (live calls).
"""
from __future__ import annotations

import hashlib
import io
import json
import tracemalloc
import zipfile

import numpy as np
import pytest
from scipy import stats

from dask_research.exceptions import CapacityError, CheckpointError, InputError
from dask_research.replay import ExperiencePlane, PrioritizedSampler, RecentSampler, checkpoints, snapshot
from dask_research.replay.cluster.worker_shard import WorkerShard

SPEC = {"action": ((), "int64"), "obs": ((2,), "float32")}


def _checkpoint(ck, sampler=None, n=30, capacity=32):
    plane = ExperiencePlane(SPEC, capacity=capacity, sampler=sampler or PrioritizedSampler(1.0, 1.0, eps=0.0),
                            seed=0)
    plane.ingest({"action": np.arange(n), "obs": np.zeros((n, 2), np.float32)})
    plane.checkpoint(ck)
    plane.close()
    return checkpoints.current(ck)


def _rewrite(version, meta=None, npz=None):
    """Replace the version's meta.json fields and/or its data.npz bytes, digest recomputed."""
    doc = json.loads((version / "meta.json").read_text())
    if npz is not None:
        (version / "data.npz").write_bytes(npz)
        doc["data"].update(bytes=len(npz), sha256=hashlib.sha256(npz).hexdigest())
    for key, value in (meta or {}).items():
        target = doc
        *path, last = key.split(".")
        for part in path:
            target = target[part]
        target[last] = value
    (version / "meta.json").write_text(json.dumps(doc))


def _arrays(version):
    with np.load(version / "data.npz") as z:
        return {k: z[k] for k in z.files}


def _npz(arrays, compressed=()):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, a in arrays.items():
            body = io.BytesIO()
            np.lib.format.write_array(body, np.asarray(a), allow_pickle=False)
            kind = zipfile.ZIP_DEFLATED if name in compressed else zipfile.ZIP_STORED
            zf.writestr(name + ".npy", body.getvalue(), compress_type=kind)
    return buf.getvalue()


# --- restored counters near 2**63 ---------------------------------------------------------------
def test_restored_counters_near_2_63_are_refused_before_use(tmp_path):
    version = _checkpoint(tmp_path / "ck")
    total = 2**63 - 3
    _rewrite(version, {"total": total, "first_key": total - 30})
    with pytest.raises(CheckpointError) as err:
        ExperiencePlane.restore(tmp_path / "ck")
    assert str(err.value) == (f"checkpoint {version}/meta.json: total is {total}; expected a whole number in "
                              "[0, 4611686018427387904]; refused before use")


def test_counters_at_the_bound_restore_and_ingest(tmp_path):
    version = _checkpoint(tmp_path / "ck")
    total = 2**62
    _rewrite(version, {"total": total, "first_key": total - 30})
    plane = ExperiencePlane.restore(tmp_path / "ck")
    try:
        assert plane.ingest({"action": np.arange(5), "obs": np.zeros((5, 2), np.float32)}) == 5
        assert plane.total == total + 5 and plane.sample(4).indices.min() >= total + 5 - 32
    finally:
        plane.close()


@pytest.mark.parametrize("key, value, message", [
    ("capacity", 0, r"capacity is 0; expected a whole number in \[1, "),
    ("capacity", 29, r"count 30 is more than the capacity 29"),
    ("spec.obs", [[0], "<f4"], r"spec.obs is \[\[0\], '<f4'\]; expected \[shape, dtype\]"),
    ("sampler.state.alpha", -1, r"sampler.state.alpha is -1; expected a finite number >= 0"),
    ("sampler.state.max_priority", 1e308, r"sampler.state.max_priority is 1e\+308; the leaf .* more than 1e\+280"),
    ("rng.state.state.inc", "odd", r"rng.state.state.inc is 'odd'; expected a whole number"),
    ("rng.state.has_uint32", 2, r"rng.state.has_uint32 is 2"),
    ("rate_limiter", {"inserts": -1, "samples": 0}, r"rate_limiter.inserts is -1"),
    ("rate_limiter", {"inserts": 1e308, "samples": 0}, r"rate_limiter.inserts is 1e\+308"),
    ("created", "yesterday", r"created is 'yesterday'; expected a finite number"),
    ("surprise", 1, r"has an unknown entry 'surprise'"),
])
def test_metadata_is_validated_by_its_schema_naming_the_file(tmp_path, key, value, message):
    version = _checkpoint(tmp_path / "ck")
    _rewrite(version, {key: value})
    with pytest.raises(CheckpointError, match=f"checkpoint {version}/meta.json: {message}"):
        ExperiencePlane.restore(tmp_path / "ck")
    fresh = WorkerShard("p", SPEC, capacity=32, sampler=PrioritizedSampler(1.0, 1.0), seed=0)
    with pytest.raises(CheckpointError, match="meta.json: "):     # a shard restore checks the same
        fresh.restore(tmp_path / "ck")
    assert fresh.plane.size == 0
    fresh.close()


def test_a_recent_sampler_window_is_validated(tmp_path):
    version = _checkpoint(tmp_path / "ck", sampler=RecentSampler(window=5))
    _rewrite(version, {"sampler.state.window": 0})
    with pytest.raises(CheckpointError, match=r"meta.json: sampler.state.window is 0; expected a whole number"):
        ExperiencePlane.restore(tmp_path / "ck")


# --- priorities whose sum overflows float64 -------------------------------------------------------
def _plane(eps=0.0, alpha=1.0):
    plane = ExperiencePlane(SPEC, capacity=32, sampler=PrioritizedSampler(alpha, 1.0, eps=eps), seed=0)
    plane.ingest({"action": np.arange(30), "obs": np.zeros((30, 2), np.float32)})
    return plane


def test_priorities_whose_sum_overflows_are_refused_up_front_and_nothing_applied():
    plane = _plane()
    before = plane.sampler.leaves(np.arange(32))
    with pytest.raises(InputError) as err:
        plane.update_priorities([10, 20], [1e308, 1e308])
    assert str(err.value) == ("update_priorities: priorities=1e+308 is invalid; expected finite numbers >= 0 "
                              "whose leaf (p + eps) ** alpha (eps=0.0, alpha=1.0) is at most 1e+280, so that "
                              "the sum over the ring stays finite")
    np.testing.assert_array_equal(plane.sampler.leaves(np.arange(32)), before)
    with pytest.raises(InputError, match=r"priorities=1e\+200 is invalid"):      # a leaf that overflows
        _plane(alpha=2.0).update_priorities([10], [1e200])
    plane.close()


def test_sampling_still_respects_priorities_at_the_bound():
    plane = _plane()
    plane.update_priorities([10, 20], [1e279, 3e279])
    assert np.isfinite(plane.sampler.mass(len(plane)))
    keys = np.concatenate([plane.sample(1000).indices for _ in range(20)])
    assert set(np.unique(keys)) <= {10, 20}          # the others' share is 28 / 4e279
    counts = np.array([(keys == 10).sum(), (keys == 20).sum()])
    assert stats.chisquare(counts, counts.sum() * np.array([0.25, 0.75])).pvalue > 1e-3
    plane.close()


def test_restored_leaves_past_the_bound_are_refused(tmp_path):
    version = _checkpoint(tmp_path / "ck")
    arrays = _arrays(version)
    arrays["sampler.leaf"][[10, 20]] = 1e308
    _rewrite(version, npz=_npz(arrays))
    with pytest.raises(CheckpointError, match=r"'sampler.leaf' holds 1e\+308 at 10 \(key 10\); priority leaves "
                                              r"are finite, >= 0 and at most 1e\+280"):
        ExperiencePlane.restore(tmp_path / "ck")


# --- data.npz: exactly the expected members, each checked before it is read ---------------------
@pytest.mark.slow
def test_an_extra_compressed_array_is_refused_without_allocating_it(tmp_path):
    """A 2 MiB data.npz with an extra 2 GiB array of zeros, deflated: the old restore read it."""
    version = _checkpoint(tmp_path / "ck")
    body = io.BytesIO()
    with zipfile.ZipFile(body, "w") as zf:
        for name, a in _arrays(version).items():
            with zf.open(name + ".npy", "w") as m:
                np.lib.format.write_array(m, a, allow_pickle=False)
        info = zipfile.ZipInfo("junk.npy")
        info.compress_type = zipfile.ZIP_DEFLATED
        with zf.open(info, "w", force_zip64=True) as m:            # 2 GiB of zeros, in 1 MiB pieces
            np.lib.format.write_array_header_1_0(m, {"descr": "|u1", "fortran_order": False, "shape": (2**31,)})
            block = bytes(2**20)
            for _ in range(2**11):
                m.write(block)
    raw = body.getvalue()
    assert len(raw) < 3 * 2**20
    _rewrite(version, npz=raw)
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError) as err:
            ExperiencePlane.restore(tmp_path / "ck")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "data.npz: is 2,0" in str(err.value) and "bytes, more than the 14,890 the arrays its metadata " \
           "describes take; refused unread" in str(err.value), str(err.value)
    assert peak < 64 * 2**20, f"the refusal allocated {peak:,} bytes"


def test_a_compressed_or_unknown_member_is_refused(tmp_path):
    version = _checkpoint(tmp_path / "ck")
    arrays = _arrays(version)
    _rewrite(version, npz=_npz(arrays, compressed={"field.obs"}))
    with pytest.raises(CheckpointError, match=r"data.npz: array 'field.obs' is compressed; a checkpoint stores "
                                              r"its arrays uncompressed"):
        ExperiencePlane.restore(tmp_path / "ck")
    _rewrite(version, npz=_npz({**arrays, "field.extra": np.zeros(30)}))
    with pytest.raises(CheckpointError, match=r"data.npz: holds an array 'field.extra' that this checkpoint "
                                              r"does not have"):
        ExperiencePlane.restore(tmp_path / "ck")
    del arrays["sampler.leaf"]                        # a prioritized checkpoint always has its leaves
    _rewrite(version, npz=_npz(arrays))
    with pytest.raises(CheckpointError, match=r"data.npz: has no array 'sampler.leaf'"):
        ExperiencePlane.restore(tmp_path / "ck")


def test_a_member_whose_header_lies_about_its_size_is_refused(tmp_path):
    version = _checkpoint(tmp_path / "ck")
    arrays = _arrays(version)
    raw = _npz(arrays)
    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(head, {"descr": "<i8", "fortran_order": False, "shape": (30,)})
    good = head.getvalue()
    with zipfile.ZipFile(io.BytesIO(raw)) as zf:
        members = {i.filename: zf.read(i) for i in zf.infolist()}
    members["field.action.npy"] = good + np.arange(3, dtype=np.int64).tobytes()      # 30 claimed, 3 held
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, body in members.items():
            zf.writestr(name, body)
    _rewrite(version, npz=buf.getvalue())
    with pytest.raises(CheckpointError, match=r"array 'field.action' has 24 bytes of data; its header "
                                              r"\(int64 \(30,\)\) makes it 240"):
        ExperiencePlane.restore(tmp_path / "ck")


def test_data_larger_than_its_arrays_take_is_refused_unread(tmp_path):
    version = _checkpoint(tmp_path / "ck")
    raw = _npz(_arrays(version)) + bytes(1 << 20)          # trailing junk: 1 MiB
    _rewrite(version, npz=raw)
    with pytest.raises(CheckpointError, match=r"data.npz: is 1,05[0-9,]+ bytes, more than the [0-9,]+ the arrays "
                                              r"its metadata describes take; refused unread"):
        ExperiencePlane.restore(tmp_path / "ck")


# --- all-zero and object priorities, oversized batches --------------------------------------------
def test_all_zero_restored_priorities_are_refused_at_restore(tmp_path):
    version = _checkpoint(tmp_path / "ck")
    arrays = _arrays(version)
    arrays["sampler.leaf"][:] = 0.0
    _rewrite(version, npz=_npz(arrays))
    with pytest.raises(CheckpointError, match=r"'sampler.leaf' is 0 for all 30 transitions: nothing could be "
                                              r"sampled"):
        ExperiencePlane.restore(tmp_path / "ck")


def test_restoring_only_zero_priorities_into_a_smaller_plane_is_refused(tmp_path):
    version = _checkpoint(tmp_path / "ck")
    arrays = _arrays(version)
    arrays["sampler.leaf"][-10:] = 0.0                     # the newest ten: all a plane of 10 keeps
    _rewrite(version, npz=_npz(arrays))
    meta, arrays, _ = snapshot.read(tmp_path / "ck")
    small = ExperiencePlane(SPEC, capacity=10, sampler=PrioritizedSampler(1.0, 1.0, eps=0.0))
    with pytest.raises(CheckpointError, match=r"every priority of the 10 transitions restored is 0"):
        small.load_snapshot(meta, arrays)
    small.close()
    assert len(ExperiencePlane.restore(tmp_path / "ck")) == 30    # whole, it has positive priorities


def test_an_update_that_would_leave_every_priority_zero_is_refused_up_front():
    plane = _plane()
    with pytest.raises(InputError, match=r"update_priorities: priorities='0 for all 30 of them' is invalid; "
                                         r"expected at least one positive priority"):
        plane.update_priorities(np.arange(30), np.zeros(30))
    assert plane.sample(8).indices.size == 8                # nothing was applied
    plane.update_priorities(np.arange(29), np.zeros(29))    # one positive priority is left: fine
    assert set(plane.sample(64).indices.tolist()) == {29}
    plane.close()


@pytest.mark.parametrize("indices, priorities, message", [
    ([10, 20], np.array([object(), object()]), r"priorities='object values such as <object object at 0x[0-9a-f]+>' is invalid; expected real numbers"),
    ([10, 20], np.array([1.0, None], dtype=object), r"priorities='object values such as 1.0'"),
    (np.array([10, None], dtype=object), [1.0, 1.0], r"indices='object values such as 10'"),
])
def test_object_priorities_or_keys_are_an_input_error(indices, priorities, message):
    plane = _plane()
    with pytest.raises(InputError, match=message):
        plane.update_priorities(indices, priorities)
    plane.close()


def test_a_batch_larger_than_memory_is_refused_before_allocating(tmp_path):
    import psutil

    plane = _plane()
    per = plane.spec.itemsize + 64
    n = max(10**9, 4 * psutil.virtual_memory().available // per)
    tracemalloc.start()
    try:
        with pytest.raises(CapacityError, match=rf"sample\({n:,}\): a batch of that many transitions "
                                                rf"\({per} bytes each while it is drawn; sample smaller batches\) "
                                                r"needs [0-9,]+ bytes but only [0-9,]+ are available"):
            plane.sample(n)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20
    for bad in (0, -3, 2.5, "8", True, None):
        with pytest.raises(InputError, match="batch_size=.* is invalid; expected a positive whole number"):
            plane.draw(bad)
    plane.close()
