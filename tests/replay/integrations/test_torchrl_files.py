"""PlaneStorage.dumps/loads write and read writer.json through the durable layer (issue 25).

Before, ``writer.json`` was ``Path.write_text``: a link there was followed (a user file was
overwritten), a FIFO blocked ``loads`` forever, and its value was used unchecked.
"""
import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tensordict")
pytest.importorskip("torchrl.data")

from tensordict import TensorDict  # noqa: E402

from dask_research.exceptions import CheckpointError  # noqa: E402
from dask_research.replay import ExperiencePlane  # noqa: E402
from dask_research.replay.integrations.torchrl import plane_replay_buffer  # noqa: E402
from dask_research.testing.threads import in_thread  # noqa: E402

SPEC = {"observation": ((4,), "float32"), "action": ((), "int64")}


def _rb(capacity=64):
    plane = ExperiencePlane(SPEC, capacity=capacity, seed=0)
    rb = plane_replay_buffer(plane, batch_size=8)
    rb.extend(TensorDict({"observation": torch.zeros(40, 4), "action": torch.arange(40)}, batch_size=[40]))
    return plane, rb


def test_writer_json_is_written_atomically_and_read_checked(tmp_path):
    plane, rb = _rb()
    rb.dumps(tmp_path / "rb")
    doc = json.loads((tmp_path / "rb" / "storage" / "plane" / "writer.json").read_text())
    assert doc == {"next": 40}
    assert not [p for p in (tmp_path / "rb" / "storage" / "plane").iterdir() if ".tmp-" in p.name]
    plane2, rb2 = _rb()
    (tmp_path / "rb" / "storage" / "plane" / "writer.json").write_text(json.dumps({"next": 64}))   # past the ring
    with pytest.raises(CheckpointError, match=r"storage/plane/writer.json: next is 64; expected a whole number in "
                                              r"\[0, 63\]; refused"):
        rb2.loads(tmp_path / "rb")
    (tmp_path / "rb" / "storage" / "plane" / "writer.json").write_text('{"next": NaN}')
    with pytest.raises(CheckpointError, match=r"writer.json: holds NaN"):
        rb2.loads(tmp_path / "rb")
    assert len(plane2) == 40                            # refused before anything was loaded
    plane.close()
    plane2.close()


def test_a_link_at_writer_json_is_refused_not_followed(tmp_path):
    plane, rb = _rb()
    rb.dumps(tmp_path / "rb")
    user = tmp_path / "notes.txt"
    user.write_text("my notes")
    w = tmp_path / "rb" / "storage" / "plane" / "writer.json"
    w.unlink()
    w.symlink_to(user)
    with pytest.raises(CheckpointError, match=r"writer.json: is a symbolic link"):
        rb.dumps(tmp_path / "rb")
    assert user.read_text() == "my notes"
    with pytest.raises(CheckpointError, match=r"writer.json: is a symbolic link"):
        rb.loads(tmp_path / "rb")
    plane.close()


@pytest.mark.timeout(120, method="thread")
def test_a_fifo_at_writer_json_is_refused_not_read(tmp_path):
    plane, rb = _rb()
    rb.dumps(tmp_path / "rb")
    w = tmp_path / "rb" / "storage" / "plane" / "writer.json"
    w.unlink()
    os.mkfifo(w)
    t, out = in_thread(lambda: rb.loads(tmp_path / "rb"), join=60)
    if t.is_alive():
        os.close(os.open(w, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("loads blocked on a FIFO writer.json")
    assert "writer.json: is a FIFO, not a regular file" in str(out.get("error")), out
    plane.close()


def test_a_second_live_buffer_cannot_dump_into_the_same_directory(tmp_path):
    plane, rb = _rb()
    rb.dumps(tmp_path / "rb")
    plane2, rb2 = _rb()
    with pytest.raises(CheckpointError, match="already held by another writer in this process"):
        rb2.dumps(tmp_path / "rb")
    assert json.loads((tmp_path / "rb" / "storage" / "plane" / "writer.json").read_text()) == {"next": 40}
    plane.close()                                       # the first plane's lease goes with it
    rb2.extend(TensorDict({"observation": torch.zeros(3, 4), "action": torch.arange(3)}, batch_size=[3]))
    rb2.dumps(tmp_path / "rb")
    assert json.loads((tmp_path / "rb" / "storage" / "plane" / "writer.json").read_text()) == {"next": 43}
    np.testing.assert_array_equal(ExperiencePlane.restore(tmp_path / "rb" / "storage" / "plane").contents()["action"],
                                  np.r_[np.arange(40), np.arange(3)])
    plane2.close()
