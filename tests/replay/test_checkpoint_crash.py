"""Checkpoints are one atomic step: a process SIGKILLed at any step of a checkpoint leaves the
previous checkpoint restorable (or the new one committed), never a mix of the two.

A real child process checkpoints a plane twice into one directory; during the second write a
hook (``checkpoints._step_hook``) makes it announce the named step and wait there, and the
parent kills it with SIGKILL and restores from the directory.
"""
import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from replay_helpers import CARTPOLE, make_batch

from dask_research.exceptions import CheckpointError
from dask_research.replay import ExperiencePlane, PrioritizedSampler, UniformSampler, checkpoints
from dask_research.replay.cluster.worker_shard import WorkerShard, checkpoint_info
from dask_research.testing.processes import wait_for

CHILD = textwrap.dedent("""
    import pathlib, sys, time
    sys.path.insert(0, {tests!r})
    from replay_helpers import CARTPOLE, make_batch
    from dask_research.replay import ExperiencePlane, PrioritizedSampler, checkpoints

    ck, step, marker = sys.argv[1:4]
    plane = ExperiencePlane(CARTPOLE, capacity=1000, sampler=PrioritizedSampler(0.6, 0.4), seed=0)
    plane.ingest(make_batch(100))
    plane.checkpoint(ck)                                  # the good checkpoint: keys 0..99
    plane.ingest(make_batch(150, start=100, seed=1))

    def hook(name):
        if name == step:
            tmp = pathlib.Path(marker + ".tmp")
            tmp.write_text(name)
            tmp.rename(marker)                            # whole when it appears
            time.sleep(600)                               # the parent kills us here

    checkpoints._step_hook = hook
    plane.checkpoint(ck)                                  # keys 0..249
    pathlib.Path(marker + ".tmp").write_text("finished")
    pathlib.Path(marker + ".tmp").rename(marker)
""")


def _killed_at(tmp_path, step):
    """Run the child until it reaches ``step`` of its second checkpoint; SIGKILL it there."""
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(tests=os.path.dirname(__file__)))
    ck, marker = tmp_path / "ck", tmp_path / "marker"
    proc = subprocess.Popen([sys.executable, str(script), str(ck), step, str(marker)],
                            env=dict(os.environ), stderr=subprocess.PIPE)
    try:
        wait_for(lambda: marker.exists() or proc.poll() is not None, 90, f"step {step}")
        assert proc.poll() is None, proc.stderr.read().decode()
        assert marker.read_text() == step
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        proc.stderr.close()
    return ck, proc.pid


@pytest.mark.timeout(180, method="thread")
@pytest.mark.parametrize("step", checkpoints.STEPS)
def test_sigkill_at_each_step_leaves_one_whole_checkpoint(tmp_path, step):
    ck, child = _killed_at(tmp_path, step)
    committed = step == "pointer-committed"
    plane = ExperiencePlane.restore(ck)
    keys = plane.contents()["action"]
    want = np.arange(250 if committed else 100)
    np.testing.assert_array_equal(keys, want)                 # whole: data and meta agree
    assert plane.total == len(want) and len(plane) == len(want)
    ref = make_batch(100)
    np.testing.assert_array_equal(plane.contents()["obs"][:100], ref["obs"])
    meta, version = checkpoints.read_meta(ck)
    assert meta["count"] == len(want) and version.name == ("v000002" if committed else "v000001")

    holder = json.loads((ck / checkpoints.LEASE).read_text())  # the dead writer's lease
    assert holder["pid"] == child
    plane.ingest(make_batch(10, start=len(want), seed=9))     # the next checkpoint takes the
    plane.checkpoint(ck)                                      # lease over and cleans up
    names = sorted(p.name for p in ck.iterdir())
    taken = checkpoints.LEASE + ".taken"                      # the taker's note for the writer taken over
    assert names == [checkpoints.LEASE, taken, checkpoints.LOCK, "CURRENT", checkpoints.current(ck).name], names
    assert json.loads((ck / checkpoints.LEASE).read_text())["pid"] == os.getpid()   # this plane's now
    np.testing.assert_array_equal(ExperiencePlane.restore(ck).contents()["action"],
                                  np.arange(len(want) + 10))
    plane.close()
    assert not (ck / checkpoints.LEASE).exists()              # released with the plane


def test_reported_shard_checkpoint_size_is_what_the_files_hold(tmp_path):
    """Actors keep ingesting while a shard writes its checkpoint: the size it reports (and
    that the learner's shard table and ``shard-lost`` events quote) is what was saved."""
    shard = WorkerShard("p", CARTPOLE, capacity=1000, sampler=UniformSampler(), seed=0)
    shard.ingest(make_batch(600))
    snapshot = shard.plane.snapshot

    def snapshot_then_ingest(*args, **kwargs):
        out = snapshot(*args, **kwargs)
        shard.ingest(make_batch(300, start=600))               # arrives while files are written
        return out

    shard.plane.snapshot = snapshot_then_ingest
    info = shard.checkpoint(tmp_path)
    assert len(shard.plane) == 900
    assert info["size"] == 600 and info["inserted"] == 600
    meta, version = checkpoints.read_meta(info["path"])
    assert checkpoint_info(meta, info["path"], version)["size"] == 600
    fresh = WorkerShard("p", CARTPOLE, capacity=1000, sampler=UniformSampler(), seed=0)
    assert fresh.restore(info["path"]) == info["size"]
    np.testing.assert_array_equal(fresh.plane.contents()["action"], np.arange(600))


def test_hostile_or_dangling_pointer_is_refused(tmp_path):
    plane = ExperiencePlane(CARTPOLE, capacity=50, sampler=PrioritizedSampler(), seed=0)
    plane.ingest(make_batch(20))
    plane.checkpoint(tmp_path / "ck")
    (tmp_path / "ck" / "CURRENT").write_text("../elsewhere")
    with pytest.raises(CheckpointError, match=r"CURRENT: names '../elsewhere'; expected a version"):
        ExperiencePlane.restore(tmp_path / "ck")
    (tmp_path / "ck" / "CURRENT").write_text("v000009\n")
    with pytest.raises(CheckpointError, match="CURRENT: names v000009, which is missing"):
        ExperiencePlane.restore(tmp_path / "ck")
    with pytest.raises(CheckpointError, match="empty/meta.json: is missing"):
        ExperiencePlane.restore(tmp_path / "empty")


def test_the_layout_before_versions_is_still_read_and_replaced(tmp_path):
    plane = ExperiencePlane(CARTPOLE, capacity=50, seed=0)
    plane.ingest(make_batch(20))
    meta, arrays = plane.snapshot()
    old = tmp_path / "ck"
    old.mkdir()
    np.savez(old / "data.npz", **arrays)
    (old / "meta.json").write_text(json.dumps(meta))
    np.testing.assert_array_equal(ExperiencePlane.restore(old).contents()["action"], np.arange(20))
    plane.checkpoint(old)
    plane.close()                                  # releases the lease (its lock file stays)
    assert sorted(p.name for p in old.iterdir()) == [checkpoints.LOCK, "CURRENT", "v000001"]


def test_a_failed_write_names_the_path_keeps_the_previous_and_leaves_nothing(tmp_path, monkeypatch):
    plane = ExperiencePlane(CARTPOLE, capacity=100, seed=0)
    plane.ingest(make_batch(30))
    plane.checkpoint(tmp_path / "ck")
    plane.ingest(make_batch(30, start=30))

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "savez", full_disk)
    with pytest.raises(CheckpointError, match=r"ck: could not be written \(OSError: No space left "
                                              r"on device\); the previous checkpoint, if any, is kept"):
        plane.checkpoint(tmp_path / "ck")
    monkeypatch.undo()
    names = sorted(p.name for p in (tmp_path / "ck").iterdir())
    assert [n for n in names if n not in (checkpoints.LEASE, checkpoints.LOCK)] == ["CURRENT", "v000001"], names
    assert checkpoints.LEASE in names              # the plane is still the directory's writer
    np.testing.assert_array_equal(ExperiencePlane.restore(tmp_path / "ck").contents()["action"],
                                  np.arange(30))
    (tmp_path / "file").write_text("x")
    with pytest.raises(CheckpointError, match="file: is a file, not a directory"):
        plane.checkpoint(tmp_path / "file")
    plane.close()
