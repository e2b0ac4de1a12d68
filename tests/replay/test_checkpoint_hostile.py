"""Checkpoints against hostile or careless directories and a second writer (review findings 5,
6, 7, 13): real files, FIFOs and links, edited arrays with recomputed digests, and two real
processes writing into one directory.

Each of these failed on the code before the fix: a FIFO blocked the reader forever, a link to
``/dev/zero`` read until memory ran out, an edited ``data.npz`` restored int64 300 into an int8
field as 44, a version without its ``data`` record was paired with another version's data, and
two writers deleted each other's versions (both reported success, nothing was restorable).
"""
import hashlib
import io
import json
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from replay_helpers import CARTPOLE, make_batch

from dask_research.exceptions import CheckpointError
from dask_research.replay import ExperiencePlane, PrioritizedSampler, checkpoints
from dask_research.replay.cluster.worker_shard import WorkerShard
from dask_research.testing.processes import wait_for
from dask_research.testing.threads import in_thread


def _plane_checkpoint(path, n=20, sampler=None):
    plane = ExperiencePlane(CARTPOLE, capacity=50, sampler=sampler or PrioritizedSampler(), seed=0)
    plane.ingest(make_batch(n))
    plane.checkpoint(path)
    plane.close()
    return checkpoints.current(path)


def _unblock(fifo):
    """Give a reader blocked on ``fifo`` its end of file (the old code blocked in open())."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


# --- finding 5: FIFOs, devices, links and huge files are refused at once --------------------
@pytest.mark.timeout(120, method="thread")
@pytest.mark.parametrize("target, message", [
    ("CURRENT", "ck/CURRENT: is a FIFO, not a regular file"),
    ("meta.json", "v000001/meta.json: is a FIFO, not a regular file"),
    ("data.npz", "v000001/data.npz: is a FIFO, not a regular file"),
])
def test_a_fifo_in_a_checkpoint_is_refused_not_read(tmp_path, target, message):
    ck = tmp_path / "ck"
    version = _plane_checkpoint(ck)
    fifo = ck / target if target == "CURRENT" else version / target
    fifo.unlink()
    os.mkfifo(fifo)
    for fn in (lambda: checkpoints.load(ck), lambda: ExperiencePlane.restore(ck)):
        t, out = in_thread(fn, join=20)
        if t.is_alive():
            _unblock(fifo)
            pytest.fail(f"reading a checkpoint whose {target} is a FIFO blocked")
        assert isinstance(out.get("error"), CheckpointError), out
        assert message in str(out["error"])


@pytest.mark.timeout(120, method="thread")
def test_links_inside_a_checkpoint_are_refused(tmp_path):
    ck = tmp_path / "ck"
    version = _plane_checkpoint(ck)
    data = version / "data.npz"
    good = data.read_bytes()
    data.unlink()
    os.symlink("/dev/zero", data)                 # the old reader hashed it until memory ran out
    t, out = in_thread(lambda: checkpoints.load(ck), join=20)
    assert not t.is_alive(), "a data.npz linked to /dev/zero was read without end"
    assert "v000001/data.npz: is a symbolic link" in str(out.get("error")), out
    data.unlink()
    data.write_bytes(good)

    elsewhere = _plane_checkpoint(tmp_path / "other")        # a whole version, linked in
    (ck / "v000007").symlink_to(elsewhere, target_is_directory=True)
    (ck / "CURRENT").write_text("v000007\n")
    with pytest.raises(CheckpointError, match="ck/v000007: is a symbolic link"):
        checkpoints.load(ck)
    (ck / "CURRENT").write_text("v000001\n")
    meta = version / "meta.json"
    meta.rename(tmp_path / "meta.json")
    meta.symlink_to(tmp_path / "meta.json")
    with pytest.raises(CheckpointError, match="v000001/meta.json: is a symbolic link"):
        ExperiencePlane.restore(ck)
    meta.unlink()
    (tmp_path / "meta.json").rename(meta)
    assert len(ExperiencePlane.restore(ck)) == 20            # untouched: still restorable
    link = tmp_path / "ck-link"                              # the directory itself may be a link
    link.symlink_to(ck, target_is_directory=True)
    assert len(ExperiencePlane.restore(link)) == 20


def test_an_oversized_pointer_or_meta_is_refused_unread(tmp_path, monkeypatch):
    ck = tmp_path / "ck"
    version = _plane_checkpoint(ck)
    monkeypatch.setattr(checkpoints, "MAX_META_BYTES", 4096)
    with open(version / "meta.json", "r+b") as f:            # sparse: cheap to make
        f.truncate(10 * 4096)
    with pytest.raises(CheckpointError, match=r"meta.json: is 40,960 bytes, more than the 4,096 it may have"):
        checkpoints.read_meta(ck)
    with open(ck / "CURRENT", "r+b") as f:
        f.truncate(10 * 4096)
    with pytest.raises(CheckpointError, match="CURRENT: is 40,960 bytes, more than the 64 it may have"):
        checkpoints.current(ck)


@pytest.mark.parametrize("name", [checkpoints.LEASE, checkpoints.LOCK])
def test_a_lease_or_lock_file_that_is_not_a_file_is_refused_and_nothing_written(tmp_path, name):
    ck = tmp_path / "ck"
    _plane_checkpoint(ck)                        # closed: its lease is released (removed)
    assert not (ck / checkpoints.LEASE).exists()
    (ck / name).unlink(missing_ok=True)
    os.mkfifo(ck / name)
    with pytest.raises(CheckpointError, match=rf"ck/\{name}: is a FIFO, not a regular file"):
        checkpoints.write(ck, {"who": "x"}, {"x": np.arange(3)})
    assert sorted(p.name for p in ck.iterdir() if p.name != checkpoints.LOCK) == sorted(
        {name, "CURRENT", "v000001"} - {checkpoints.LOCK})
    (ck / name).unlink()
    (ck / name).symlink_to(tmp_path / "outside")    # a write would follow it out
    with pytest.raises(CheckpointError, match=rf"ck/\{name}: is a symbolic link"):
        checkpoints.write(ck, {"who": "x"}, {"x": np.arange(3)})
    assert not (tmp_path / "outside").exists()
    assert checkpoints.current(ck).name == "v000001"


# --- finding 13: a version must carry the digest of its own data ---------------------------
@pytest.mark.parametrize("edit", ["deleted", "null"])
def test_a_version_without_its_data_record_is_refused(tmp_path, edit):
    ck = tmp_path / "ck"
    checkpoints.write(ck, {"who": "v1"}, {"x": np.arange(3)})
    v1_data = (checkpoints.current(ck) / "data.npz").read_bytes()
    v2 = checkpoints.write(ck, {"who": "v2"}, {"x": np.arange(5)})
    (v2 / "data.npz").write_bytes(v1_data)                   # v1's data under v2's metadata
    meta = json.loads((v2 / "meta.json").read_text())
    if edit == "deleted":
        del meta["data"]
    else:
        meta["data"] = None
    (v2 / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="v000002/meta.json: has no 'data' record"):
        checkpoints.load(ck)


# --- finding 6: a restore checks what ingest checks --------------------------------------------
def _edit_data(ck, **replace):
    """Replace arrays of the committed data.npz and recompute its digest (as any writer can)."""
    version = checkpoints.current(ck)
    with np.load(version / "data.npz") as z:
        arrays = {k: z[k] for k in z.files}
    arrays.update(replace)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    raw = buf.getvalue()
    (version / "data.npz").write_bytes(raw)
    meta = json.loads((version / "meta.json").read_text())
    meta["data"].update(bytes=len(raw), sha256=hashlib.sha256(raw).hexdigest())
    (version / "meta.json").write_text(json.dumps(meta))
    return meta


SPEC = {"x": ((), "int8"), "y": ((2,), "float32")}


def _small_checkpoint(ck):
    p = ExperiencePlane(SPEC, capacity=4, sampler=PrioritizedSampler(), migrate="manual")
    p.ingest({"x": np.array([1, 2, 3, 4], np.int8), "y": np.ones((4, 2), np.float32)})
    p.checkpoint(ck)
    p.close()


@pytest.mark.parametrize("replace, message", [
    ({"field.x": np.array([300, 2, 3, 4], np.int64)},          # was restored as 44
     r"data.npz: array 'field.x' is int64 \(4,\); this checkpoint's metadata makes it int8 \(4,\)"),
    ({"field.y": np.full((4, 2), 1e300)},                      # was restored as inf
     r"array 'field.y' is float64 \(4, 2\)"),
    ({"field.y": np.full((4, 1), 7.0, np.float32)},            # was broadcast into (2,)
     r"array 'field.y' is float32 \(4, 1\); this checkpoint's metadata makes it float32 \(4, 2\)"),
    ({"field.x": np.array([2.7, 2, 3, 4])},                    # was restored as 2
     r"array 'field.x' is float64"),
    ({"field.x": np.array([1, 2, 3], np.int8)},                # fewer than count
     r"array 'field.x' is int8 \(3,\)"),
    ({"sampler.leaf": np.array([np.nan, 1, 1, 1])},            # sample() failed afterwards
     r"'sampler.leaf' holds nan at 0 \(key 0\); priority leaves are finite, >= 0 and at most 1e\+280"),
    ({"sampler.leaf": np.array([-5.0, 1, 1, 1])},
     r"'sampler.leaf' holds -5.0 at 0"),
    ({"sampler.leaf": np.ones(3)},
     r"'sampler.leaf' is float64 \(3,\); this checkpoint's metadata makes it float64 \(4,\)"),
])
def test_an_edited_checkpoint_with_a_recomputed_digest_is_refused(tmp_path, replace, message):
    ck = tmp_path / "ck"
    _small_checkpoint(ck)
    _edit_data(ck, **replace)
    with pytest.raises(CheckpointError, match=message):
        ExperiencePlane.restore(ck, migrate="manual")


@pytest.mark.parametrize("meta_edit, message", [
    ({"first_key": 7}, r"meta.json: first_key 7 \+ count 4 != total 4"),
    ({"count": -1}, r"meta.json: count is -1; expected a whole number in \[0, 4611686018427387904\]"),
    ({"total": True}, r"meta.json: total is True; expected a whole number"),
])
def test_edited_counters_are_refused(tmp_path, meta_edit, message):
    ck = tmp_path / "ck"
    _small_checkpoint(ck)
    version = checkpoints.current(ck)
    meta = json.loads((version / "meta.json").read_text())
    meta.update(meta_edit)
    (version / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=message):
        ExperiencePlane.restore(ck, migrate="manual")


def test_a_nan_max_priority_is_refused(tmp_path):
    ck = tmp_path / "ck"
    _small_checkpoint(ck)
    version = checkpoints.current(ck)
    meta = json.loads((version / "meta.json").read_text())
    meta["sampler"]["state"]["max_priority"] = float("nan")
    (version / "meta.json").write_text(json.dumps(meta))      # JSON NaN, as Python writes it
    with pytest.raises(CheckpointError, match="meta.json: holds NaN, which is not JSON"):
        ExperiencePlane.restore(ck, migrate="manual")


def test_a_shard_restore_checks_too_and_stays_empty(tmp_path):
    shard = WorkerShard("p", SPEC, capacity=4, sampler=PrioritizedSampler(), seed=0)
    shard.ingest({"x": np.array([1, 2, 3, 4], np.int8), "y": np.ones((4, 2), np.float32)})
    info = shard.checkpoint(tmp_path)
    _edit_data(info["path"], **{"field.x": np.array([300, 2, 3, 4], np.int64)})
    fresh = WorkerShard("p", SPEC, capacity=4, sampler=PrioritizedSampler(), seed=0)
    with pytest.raises(CheckpointError, match="array 'field.x' is int64"):
        fresh.restore(info["path"])
    assert len(fresh.plane) == 0 and fresh.plane.total == 0


# --- finding 7: one writer per directory, across processes ----------------------------------
WRITER = textwrap.dedent("""
    import pathlib, sys, time
    import numpy as np
    from dask_research.replay import checkpoints

    ck, marker, go = sys.argv[1:4]

    def hook(name):
        if name == "version-renamed":                     # hold the lock, version not current
            pathlib.Path(marker).write_text(name)
            deadline = time.monotonic() + 120
            while not pathlib.Path(go).exists() and time.monotonic() < deadline:
                time.sleep(0.05)

    checkpoints._step_hook = hook
    print(checkpoints.write(ck, {"who": "A"}, {"x": np.arange(4)}).name, flush=True)
""")
SECOND = ("import sys, numpy as np; from dask_research.replay import checkpoints; "
          "print(checkpoints.write(sys.argv[1], {'who': 'B'}, {'x': np.arange(5)}).name)")


@pytest.mark.slow
@pytest.mark.timeout(180, method="thread")
def test_a_second_process_is_refused_naming_the_writer_and_nothing_is_lost(tmp_path):
    ck, marker, go = tmp_path / "ck", tmp_path / "marker", tmp_path / "go"
    checkpoints.write(ck, {"who": "first"}, {"x": np.arange(3)})          # a good v000001
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    a = subprocess.Popen([sys.executable, str(script), str(ck), str(marker), str(go)],
                         env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: marker.exists() or a.poll() is not None, 90, "writer A at version-renamed")
        assert a.poll() is None, a.stderr.read().decode()
        b = subprocess.run([sys.executable, "-c", SECOND, str(ck)], env=dict(os.environ),
                           capture_output=True, text=True, timeout=90)
        assert b.returncode != 0, b.stdout
        assert f"on host {socket.gethostname()}, pid {a.pid}" in b.stderr, b.stderr
        assert "CheckpointError" in b.stderr
        assert not any(p.name.startswith(".tmp-") for p in ck.iterdir() if "v000002" not in p.name)
        go.write_text("go")
        out, err = a.communicate(timeout=90)
        assert a.returncode == 0, err.decode()
        assert out.decode().strip() == "v000002"
    finally:
        if a.poll() is None:
            a.kill()
            a.wait(timeout=30)
    meta, arrays, where = checkpoints.load(ck)                # A's checkpoint, whole
    assert (meta["who"], arrays["x"].tolist(), where.name) == ("A", [0, 1, 2, 3], "v000002")
    assert sorted(p.name for p in ck.iterdir()) == [checkpoints.LOCK, "CURRENT", "v000002"]
    b = subprocess.run([sys.executable, "-c", SECOND, str(ck)], env=dict(os.environ),
                       capture_output=True, text=True, timeout=90)
    assert b.returncode == 0 and b.stdout.strip() == "v000003", b.stderr   # free again
    assert checkpoints.load(ck)[0]["who"] == "B"


def test_leftovers_are_removed_and_version_names_are_exact(tmp_path):
    ck = tmp_path / "ck"
    checkpoints.write(ck, {"who": "v1"}, {"x": np.arange(3)})
    (ck / "v000000").mkdir()                                  # older: a leftover
    v2 = checkpoints.write(ck, {"who": "v2"}, {"x": np.arange(3)})
    assert sorted(p.name for p in ck.iterdir()) == [checkpoints.LOCK, "CURRENT", v2.name]
    assert checkpoints._VERSION.fullmatch("v000001\n") is None             # no trailing newline
    assert checkpoints._VERSION.fullmatch("v\u0661\u0662\u0663\u0664\u0665\u0666") is None


def test_a_version_replaced_between_reads_is_named(tmp_path):
    ck = tmp_path / "ck"
    checkpoints.write(ck, {"who": "v1"}, {"x": np.arange(3)})
    meta, where = checkpoints.read_meta(ck)
    checkpoints.write(ck, {"who": "v2"}, {"x": np.arange(3)})      # removes v000001
    with pytest.raises(CheckpointError, match="v000001: is gone .a newer checkpoint "
                                              "replaced it after it was read"):
        checkpoints.load(ck, where)
    assert checkpoints.load(ck)[0]["who"] == "v2"


@pytest.mark.parametrize("capacity", ["many", -5, 0, 2.5, True, None])
def test_a_checkpoint_with_an_unusable_capacity_is_refused_by_name(tmp_path, capacity):
    """A capacity that is not a positive whole number is a CheckpointError, not a raw ValueError."""
    import json

    from dask_research import replay
    from dask_research.exceptions import CheckpointError

    plane = replay.ExperiencePlane({"x": ((), "float32")}, capacity=8, seed=0)
    plane.ingest({"x": np.arange(3.0)})
    plane.checkpoint(tmp_path / "ck")
    plane.close()
    meta = replay.checkpoints.current(tmp_path / "ck") / "meta.json"
    doc = json.loads(meta.read_text())
    doc["capacity"] = capacity
    meta.write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match="capacity"):
        replay.ExperiencePlane.restore(tmp_path / "ck")
