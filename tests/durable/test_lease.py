"""durable.Lease on real processes: races, SIGKILL, SIGSTOP, forged and hostile lease files.

Every wait here is for an event, with a generous bound; the only times asserted are lower
bounds measured by the waiting process's own clock (a loaded machine makes them longer, never
shorter).
"""
from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from dask_research.durable import Files, Lease, describe_holder
from dask_research.durable.lease import MAX_BEAT
from dask_research.exceptions import CheckpointError, StoreError
from dask_research.testing.processes import LineProcess, line_processes

HOLDER = str(Path(__file__).with_name("holder.py"))
BOUND = 120.0       # generous bound on any one wait for an event


def Holder(start, root: Path, name: str = "lease.json", timeout: float = 2.0, wait: str = "none") -> LineProcess:
    """A holder.py process holding the lease ``root/name``."""
    return start([sys.executable, HOLDER, str(root), name, str(timeout), wait])


@pytest.fixture
def holders():
    with line_processes(BOUND) as start:
        yield lambda *args, **kwargs: Holder(start, *args, **kwargs)


def _files(tmp_path: Path, error=StoreError) -> Files:
    return Files(tmp_path, error=error)


def _lease(files: Files, name: str = "lease.json", timeout: float = 2.0, wait=None, said=None) -> Lease:
    return Lease(files, files.join(name), label="the test's file", timeout=timeout, wait=wait,
                 announce=(lambda kind, msg: said.append((kind, msg))) if said is not None else lambda k, m: None)


@pytest.mark.slow
def test_of_racing_processes_exactly_one_holds_the_lease(tmp_path, holders):
    procs = [holders(tmp_path, wait="0", timeout=30) for _ in range(4)]
    outcomes = [p.expect("") for p in procs]
    # Each either holds it or is refused once it has seen the holder alive (its lease beats).
    while any(o.startswith(("wait", "takeover")) for o in outcomes):
        outcomes = [p.expect("") if o.startswith(("wait", "takeover")) else o for p, o in zip(procs, outcomes)]
    assert sum(o.startswith("held") for o in outcomes) == 1, outcomes
    assert sum(o.startswith("refused") for o in outcomes) == 3, outcomes
    refused = next(o for o in outcomes if o.startswith("refused"))
    assert f"on host {socket.gethostname()}" in refused and "alive" in refused


def test_a_killed_holder_on_this_host_is_taken_over_at_once(tmp_path, holders):
    first = holders(tmp_path, timeout=3600)        # a heartbeat that would hold an hour
    first.expect("held")
    first.proc.kill()
    first.proc.wait(30)
    said: list = []
    t0 = time.monotonic()
    with _lease(_files(tmp_path), timeout=3600, said=said) as lease:
        assert lease.holder()["token"] == lease.token
    assert time.monotonic() - t0 < 600          # not the hour: the dead pid decided
    assert said and said[0][0] == "takeover" and "is gone" in said[0][1]


@pytest.mark.slow
def test_a_frozen_holder_is_taken_over_after_the_timeout_and_stops_when_it_wakes(tmp_path, holders):
    first = holders(tmp_path, timeout=2.0)
    token = first.expect("held").split()[1]
    os.kill(first.proc.pid, signal.SIGSTOP)
    said: list = []
    t0 = time.monotonic()
    lease = _lease(_files(tmp_path), timeout=2.0, said=said).acquire()
    try:
        assert time.monotonic() - t0 >= 2.0        # judged by our own clock: at least the timeout
        assert lease.holder()["token"] == lease.token != token
        assert [k for k, _ in said] == ["wait", "takeover"]
        os.kill(first.proc.pid, signal.SIGCONT)
        first.send("check")
        lost = first.expect("lost")
        assert f"pid {os.getpid()}" in lost and socket.gethostname() in lost and "None" not in lost
        lease.check_held()                         # the new holder keeps it
    finally:
        lease.release()


def test_a_fresh_check_reads_the_lease_again_at_once(tmp_path):
    """check_held(fresh=True) sees a replaced lease at the next write, not half a beat later."""
    files = _files(tmp_path)
    with _lease(files, timeout=3600) as lease:
        lease.check_held()                         # just verified: the next plain check reads nothing
        doc = {**lease.holder(), "token": "t" * 32, "owner": "bob"}
        (tmp_path / "lease.json").write_text(json.dumps(doc))
        lease.check_held()                         # within half a beat of an hour: not read again
        with pytest.raises(StoreError, match="lost the lease .*held now by bob"):
            lease.check_held("next.json", fresh=True)
        assert not lease.held


@pytest.mark.parametrize("heartbeat", [1e300, float("nan"), "soon", None, "hour-ahead"])
def test_a_forged_or_skewed_heartbeat_holds_nothing_beyond_the_timeout(tmp_path, heartbeat):
    files = _files(tmp_path)
    if heartbeat == "hour-ahead":
        heartbeat = time.time() + 3600
    doc = {"format": "dask-research-lease/1", "token": "f" * 32, "owner": "mallory", "host": "elsewhere",
           "pid": 1, "started": time.time(), "heartbeat": heartbeat, "beats": 1}
    (tmp_path / "lease.json").write_text(json.dumps(doc))    # NaN as json writes it: NaN
    said: list = []
    t0 = time.monotonic()
    with _lease(files, timeout=1.0, said=said) as lease:
        assert time.monotonic() - t0 >= 1.0
        assert lease.holder()["token"] == lease.token
    assert "mallory on host elsewhere" in said[0][1]


def test_an_empty_lock_file_of_an_earlier_version_is_free_at_once(tmp_path):
    (tmp_path / "lease.json").write_bytes(b"")
    said: list = []
    with _lease(_files(tmp_path), timeout=3600, said=said) as lease:
        assert lease.holder()["token"] == lease.token
    assert said[0][0] == "takeover" and "empty" in said[0][1]


def test_a_torn_lease_is_stale_only_after_the_timeout(tmp_path):
    (tmp_path / "lease.json").write_bytes(b'{"token": "ab')
    t0 = time.monotonic()
    with _lease(_files(tmp_path), timeout=1.0) as lease:
        assert time.monotonic() - t0 >= 1.0 and lease.held


@pytest.mark.slow
def test_a_live_holder_keeps_its_lease_and_a_second_writer_waits_then_gives_up(tmp_path, holders):
    first = holders(tmp_path, timeout=1.0)
    first.expect("held")
    said: list = []
    t0 = time.monotonic()
    with pytest.raises(StoreError) as err:
        _lease(_files(tmp_path), timeout=1.0, wait=3.0, said=said).acquire()
    assert time.monotonic() - t0 >= 3.0
    assert "gave up after waiting" in str(err.value) and "alive" in str(err.value)
    first.send("check")
    first.expect("ok")                              # beats kept it: never taken over
    first.send("release")
    first.expect("released")
    with _lease(_files(tmp_path), timeout=1.0, wait=0) as lease:   # free again, at once
        assert lease.held


def test_in_one_process_a_second_lease_with_wait_0_is_refused_at_once(tmp_path):
    files = _files(tmp_path, CheckpointError)
    with _lease(files, timeout=3600):
        t0 = time.monotonic()
        with pytest.raises(CheckpointError, match="already held by another writer in this process"):
            _lease(files, timeout=3600, wait=0).acquire()
        assert time.monotonic() - t0 < 600


def test_release_removes_only_its_own_lease(tmp_path):
    files = _files(tmp_path)
    lease = _lease(files, timeout=30).acquire()
    lease._stop.set()                               # no more beats: the test swaps the file
    other = {"format": "x", "token": "0" * 32, "owner": "o", "host": "h", "pid": 7}
    (tmp_path / "lease.json").write_text(json.dumps(other))
    lease.release()
    assert json.loads((tmp_path / "lease.json").read_text())["token"] == "0" * 32


@pytest.mark.parametrize("kind", ["symlink", "fifo", "directory"])
def test_a_lease_file_that_is_not_a_regular_file_is_refused_by_name(tmp_path, kind):
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's own file\n")
    target = tmp_path / "lease.json"
    if kind == "symlink":
        target.symlink_to(victim)
    elif kind == "fifo":
        os.mkfifo(target)
    else:
        target.mkdir()
    with pytest.raises(StoreError) as err:
        _lease(_files(tmp_path), timeout=30).acquire()
    assert "lease.json" in str(err.value)
    assert victim.read_text() == "the user's own file\n"


def test_a_lock_file_linked_to_a_user_file_is_refused_and_the_file_untouched(tmp_path, holders):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    (tmp_path / "lease.json.lock").symlink_to(victim)
    (tmp_path / "lease.json").write_bytes(b"")       # an old released lease: taking it needs the lock
    with pytest.raises(StoreError, match="symbolic link"):
        _lease(_files(tmp_path), timeout=30).acquire()
    assert victim.read_text() == "keep me\n"


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_a_bad_lock_file_is_refused_when_the_lease_is_free_too(tmp_path, kind):
    """Taking a free lease needs no lock, but its heartbeat does: the lock file is checked up front."""
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    if kind == "symlink":
        (tmp_path / "lease.json.lock").symlink_to(victim)
    else:
        os.mkfifo(tmp_path / "lease.json.lock")
    with pytest.raises(StoreError, match=r"lease\.json\.lock: (is a symbolic link|is a FIFO)"):
        _lease(_files(tmp_path), timeout=30).acquire()
    assert victim.read_text() == "keep me\n" and not (tmp_path / "lease.json").exists()


def test_describe_holder_shows_hostile_fields_as_plain_text():
    text = describe_holder({"owner": "\x1b[31mred\x1b[0m" + "x" * 200, "host": ["h"], "pid": True,
                            "started": -1, "heartbeat": 1e308})
    assert "\x1b" not in text and len(text) < 250
    assert "pid ?" in text and "heartbeat unknown" in text and "since ?" in text


@pytest.mark.parametrize("timeout", [0, -1, float("nan"), float("inf"), "x"])
def test_a_bad_timeout_is_one_clear_error(tmp_path, timeout):
    with pytest.raises(StoreError, match="lease timeout"):
        _lease(_files(tmp_path), timeout=timeout)


def test_the_heartbeat_changes_the_file_whatever_the_clock_says(tmp_path, monkeypatch):
    files = _files(tmp_path)
    monkeypatch.setattr(time, "time", lambda: 1000.0)           # a clock that stands still
    with _lease(files, timeout=0.4) as lease:
        first = (tmp_path / "lease.json").read_bytes()
        deadline = time.monotonic() + BOUND
        while (tmp_path / "lease.json").read_bytes() == first:
            assert time.monotonic() < deadline, "the lease never beat"
            time.sleep(0.05)
        assert lease.holder()["beats"] > 1


def test_a_writer_woken_after_its_taker_finished_still_names_the_taker(tmp_path, holders):
    first = holders(tmp_path, timeout=1.0)
    first.expect("held")
    os.kill(first.proc.pid, signal.SIGSTOP)
    with _lease(_files(tmp_path), timeout=1.0) as lease:
        assert lease.held
    assert not (tmp_path / "lease.json").exists()             # the taker let it go
    os.kill(first.proc.pid, signal.SIGCONT)
    first.send("check")
    lost = first.expect("lost")
    assert f"taken over by root on host {socket.gethostname()}, pid {os.getpid()}" in lost.replace(
        os.environ.get("USER", "root"), "root")
    assert "which has let it go since" in lost


def test_a_takeover_another_taker_won_leaves_no_note_naming_this_one(tmp_path, holders):
    """Two takers judge a dead holder's lease stale; the other one removes it and holds the
    lease. This taker later gets the lease the ordinary way, after the other releases it: it
    took nothing over, so its note must not tell the dead holder's writer that it did."""
    first = holders(tmp_path, timeout=3600)
    dead = first.expect("held").split()[1]
    first.proc.kill()
    first.proc.wait(30)
    files = _files(tmp_path)
    lease, other = _lease(files, timeout=3600), _lease(_files(tmp_path), timeout=3600)
    released = threading.Event()

    def the_other_taker_wins(seen):
        (tmp_path / "lease.json").unlink()
        other.acquire()
        threading.Timer(1.0, lambda: (other.release(), released.set())).start()
        return False

    lease._take_over = the_other_taker_wins
    with lease:
        assert released.is_set() and lease.holder()["token"] == lease.token
    note = tmp_path / "lease.json.taken"
    assert not note.exists() or json.loads(note.read_text())["token"] != dead


def test_describe_holder_survives_a_heartbeat_no_float_can_hold():
    assert "heartbeat unknown" in describe_holder({"heartbeat": 10**400, "started": 10**400})


def test_a_heartbeat_never_brings_back_a_directory_its_user_removed(tmp_path):
    import shutil

    files = _files(tmp_path)
    lease = Lease(files, files.join("ck", "LEASE"), label="ck", timeout=0.4, announce=lambda k, m: None).acquire()
    try:
        shutil.rmtree(tmp_path / "ck")
        deadline = time.monotonic() + BOUND
        while lease.held and time.monotonic() < deadline:     # beats notice the lease is gone
            time.sleep(0.05)
        time.sleep(0.5)                                         # and a few more beats' time
        assert not (tmp_path / "ck").exists()
    finally:
        lease.release()
    assert not (tmp_path / "ck").exists()


def test_a_release_run_by_a_finalizer_during_registration_does_not_deadlock(tmp_path, monkeypatch):
    """CI hung here: a collected scheduler's ``weakref.finalize(..., release)`` ran inside the
    registration guard of the next lease (Python runs finalizers at any allocation), and the
    guard was not reentrant. Here the finalizer is made to run at exactly that point."""
    import threading

    from dask_research.durable import lease as lease_module

    old = _lease(_files(tmp_path), "old.json").acquire()
    new = _lease(_files(tmp_path), "new.json")

    finalizer = [old.release]                  # runs once, as a finalizer does

    class FinalizerInside(dict):
        def get(self, key, default=None):       # what a garbage collection at this point would do
            if finalizer:
                finalizer.pop()()
            return super().get(key, default)

    monkeypatch.setattr(lease_module, "_HELD", FinalizerInside(lease_module._HELD))
    done = threading.Event()

    def register():
        try:
            new.acquire()
        finally:
            done.set()

    threading.Thread(target=register, daemon=True).start()
    assert done.wait(BOUND), "acquiring a lease deadlocked on a release run inside its registration"
    try:
        assert new.held and not old.held
        assert not (tmp_path / "old.json").exists() and (tmp_path / "new.json").exists()
    finally:
        new.release()


def test_a_taker_paused_since_it_judged_leaves_the_lease_held_meanwhile_in_place(tmp_path, holders, monkeypatch):
    """A taker frozen after judging an old lease stale wakes when another has taken it over and
    holds it anew: it must not move the new lease aside even for a moment, or a waiter polling
    then creates a second one and two processes hold the lease."""
    first = holders(tmp_path, timeout=3600)
    token = first.expect("held").split()[1]
    files = _files(tmp_path)
    taker, waiter = _lease(files, timeout=3600), _lease(_files(tmp_path), timeout=3600)
    created: list = []
    rename = files.rename

    def rename_while_a_waiter_polls(src, dst):
        rename(src, dst)
        created.append(waiter._try_create())        # the waiter's poll in that moment

    monkeypatch.setattr(files, "rename", rename_while_a_waiter_polls)
    judged = b'{"token": "' + b"0" * 32 + b'"}'        # the lease it judged stale, long gone
    assert taker._take_over(judged) is False
    assert True not in created
    assert json.loads((tmp_path / "lease.json").read_text())["token"] == token
    first.send("check")
    first.expect("ok")



def test_a_waiter_set_to_a_shorter_timeout_does_not_take_a_live_holder_for_dead(tmp_path, holders):
    """A holder set to a 3600 s timeout beat every 900 s; a process set to 2 s took it for dead
    after 2 s, and the live holder went on writing for up to 450 s (two holders). A holder now
    beats at most MAX_BEAT apart and says so in the lease, and a waiter waits four such beats."""
    first = holders(tmp_path, timeout=3600)
    token = first.expect("held").split()[1]
    said: list = []
    with pytest.raises(StoreError, match="whose lease is alive"):
        _lease(_files(tmp_path), timeout=2, wait=0, said=said).acquire()
    assert said and said[0][0] == "wait" and f"does not change for {4 * MAX_BEAT:g} s" in said[0][1], said
    assert json.loads((tmp_path / "lease.json").read_text())["token"] == token
    first.send("check")
    first.expect("ok")


def test_a_forged_beat_delays_a_waiter_by_four_beats_at_most(tmp_path):
    """A lease file left with an absurd beat (a bug, or someone hostile) makes a waiter wait at
    most 4 * MAX_BEAT, and a beat that is not a positive number is ignored."""
    lease = _lease(_files(tmp_path), timeout=2)
    assert lease.limit({"beat": 1e300}) == lease.limit({"beat": float("inf")}) == 4 * MAX_BEAT
    assert lease.limit({"beat": 10**400}) == 4 * MAX_BEAT          # no float: OverflowError before
    for junk in ("5", None, True, float("nan"), -5, [5]):
        assert lease.limit({"beat": junk}) == 2
    assert lease.limit({"beat": 0.1}) == 2 and _lease(_files(tmp_path), timeout=60).limit({"beat": 5}) == 60


def test_a_holder_whose_machine_was_suspended_looks_at_its_lease_again(tmp_path, monkeypatch):
    """``time.monotonic`` stands still while a machine is suspended: a holder that judged its last
    look recent by it wrote on after a suspend during which another host took its lease over.
    The holder's clock goes on through a suspend (CLOCK_BOOTTIME)."""
    if not hasattr(time, "CLOCK_BOOTTIME"):
        pytest.skip("no CLOCK_BOOTTIME on this platform")
    files = _files(tmp_path)
    with _lease(files, timeout=30) as lease:
        lease.check_held()                               # a fresh look: ours
        doc = json.loads((tmp_path / "lease.json").read_text())
        (tmp_path / "lease.json").write_text(json.dumps({**doc, "token": "f" * 32}))   # taken over
        frozen, real = time.monotonic(), time.clock_gettime
        monkeypatch.setattr(time, "monotonic", lambda: frozen)        # suspended: stood still
        monkeypatch.setattr(time, "clock_gettime",
                            lambda which: real(which) + (600.0 if which == time.CLOCK_BOOTTIME else 0.0))
        with pytest.raises(StoreError, match="lost the lease"):
            lease.check_held()
        monkeypatch.undo()
