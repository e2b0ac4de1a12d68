"""durable.Files on real files: links, FIFOs, devices, caps on both sides, atomic writes under SIGKILL."""
from __future__ import annotations

import errno
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dask_research.durable import Files, jsondoc, schema
from dask_research.exceptions import CheckpointError, StoreError
from dask_research.testing.threads import in_thread


def _files(root: Path, error=StoreError) -> Files:
    return Files(root, error=error)


@pytest.fixture
def synced(monkeypatch) -> set:
    """The inodes of every file and directory ``os.fsync`` is called on while the test runs."""
    seen: set = set()
    real_fsync = os.fsync

    def recording(fd):
        seen.add(os.fstat(fd).st_ino)
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording)
    return seen


def test_the_root_may_be_a_link_but_nothing_below_it(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "root").symlink_to(real)
    files = _files(tmp_path / "root")
    assert files.write_json(files.join("a", "x.json"), {"ok": 1}, cap=100)
    assert json.loads((real / "a" / "x.json").read_text()) == {"ok": 1}
    outside = tmp_path / "outside"
    outside.mkdir()
    (real / "b").symlink_to(outside)
    with pytest.raises(StoreError, match="symbolic link"):
        files.write_json(files.join("b", "x.json"), {"evil": 1}, cap=100)
    with pytest.raises(StoreError, match="symbolic link"):
        files.read_json(files.join("b", "x.json"), cap=100)
    assert list(outside.iterdir()) == []
    with pytest.raises(StoreError, match="symbolic link"):
        files.refuse_links_under(files.join("b"))
    with pytest.raises(StoreError, match="outside"):
        files.read_bytes(files.join("..", "real", "a", "x.json"), cap=100)


@pytest.mark.parametrize("kind", ["fifo", "directory", "link-to-dev-zero", "device"])
def test_special_files_are_refused_before_a_byte_is_read_and_never_block(tmp_path, kind):
    files = _files(tmp_path, CheckpointError)
    target = tmp_path / "doc.json"
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "directory":
        target.mkdir()
    elif kind == "link-to-dev-zero":
        target.symlink_to("/dev/zero")
    else:
        try:
            os.mknod(target, stat.S_IFCHR | 0o600, os.makedev(1, 5))    # /dev/zero's numbers
        except PermissionError:
            pytest.skip("creating a device node needs root")
    for call in (lambda: files.read_json(str(target), cap=1 << 30),
                 lambda: files.open_append(str(target), cap=1 << 30),
                 lambda: files.write_bytes(str(target), b"x", cap=10, replace=True)):
        t, out = in_thread(call, join=60)
        assert not t.is_alive(), f"{kind}: blocked"
        assert isinstance(out.get("error"), CheckpointError), out
        assert "doc.json" in str(out["error"])


def test_a_read_is_bounded_and_the_writer_refuses_what_its_reader_would(tmp_path):
    files = _files(tmp_path)
    path = files.join("big.json")
    (tmp_path / "big.json").write_bytes(b"[" + b"0," * 600 + b"0]")
    with pytest.raises(StoreError, match="more than the 1,000"):
        files.read_bytes(path, cap=1000)
    with pytest.raises(StoreError, match="more than the 1,000 its readers accept; nothing was written"):
        files.write_bytes(files.join("new.json"), b"x" * 1001, cap=1000)
    assert not (tmp_path / "new.json").exists()
    af = files.open_append(files.join("log"), cap=10)
    af.write(b"12345")
    with pytest.raises(StoreError, match="would grow to 11"):
        af.write(b"678901")
    af.close()
    assert (tmp_path / "log").read_bytes() == b"12345"


@pytest.mark.parametrize("raw, problem", [
    (b'{"x": NaN}', "NaN"), (b'{"x": -Infinity}', "Infinity"), (b"[" * 600 + b"]" * 600, "nested"),
    (b"[" * 5000 + b"]" * 5000, "nested"), (b"1" * 400, "digits"), (b"\xff\xfe", "UTF-8"), (b"{", "JSON"),
    (b'{"x": 1e400}', "too large for a float"), (b"[-1e999]", "too large for a float"),
])
def test_documents_the_project_never_writes_are_refused_naming_the_file(tmp_path, raw, problem):
    (tmp_path / "doc.json").write_bytes(raw)
    with pytest.raises(StoreError, match=problem) as err:
        _files(tmp_path).read_json(str(tmp_path / "doc.json"), cap=1 << 20)
    assert str(err.value).startswith(str(tmp_path / "doc.json"))


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False,
                    allow_infinity=False) | st.text(max_size=8),
                    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children,
                                                                                       max_size=4),
                    max_leaves=30))
def test_what_dumps_writes_loads_reads_back(value):
    assert jsondoc.loads(jsondoc.dumps(value)) == value


def _depth(value):
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, (list, tuple)):
        return 1 + max(map(_depth, value), default=0)
    return 0


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.recursive(st.integers() | st.none(), lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=2), inner, max_size=3) | st.tuples(inner, inner), max_leaves=40))
def test_depth_counts_nesting_as_a_recursive_walk_does(value):
    """jsondoc.depth (no recursion; a list of scalars looked at once) agrees with the plain recursive count."""
    assert jsondoc.depth(value) == _depth(value)
    assert jsondoc.depth(value, limit=1) == min(_depth(value), 2)


def test_depth_finds_a_container_after_many_scalars():
    assert jsondoc.depth([0] * 100_000 + [[[]]]) == 3 and jsondoc.depth({"h": [0] * 100_000}) == 2


def test_no_replace_writes_race_cleanly_between_processes(tmp_path):
    script = textwrap.dedent(f"""
        import sys
        from dask_research.durable import Files
        from dask_research.exceptions import StoreError
        f = Files({str(tmp_path)!r}, error=StoreError)
        print(f.write_bytes(f.join("one.json"), sys.argv[1].encode() * 100000, cap=1 << 30))
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script, str(i)], stdout=subprocess.PIPE, text=True)
             for i in range(6)]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert sorted(outs) == ["False"] * 5 + ["True"], outs
    data = (tmp_path / "one.json").read_bytes()
    assert len(data) == 100000 and len(set(data)) == 1              # one writer's whole content
    assert [p.name for p in tmp_path.iterdir()] == ["one.json"]      # no temporary left


@pytest.mark.slow
def test_a_writer_killed_at_any_moment_leaves_the_old_or_the_new_file_never_a_torn_one(tmp_path):
    script = textwrap.dedent(f"""
        from dask_research.durable import Files
        from dask_research.exceptions import StoreError
        f = Files({str(tmp_path)!r}, error=StoreError)
        i = 0
        print("go", flush=True)
        while True:
            i += 1
            f.write_bytes(f.join("doc"), (b"%d;" % i) * 200000, cap=1 << 30, replace=True)
    """)
    for round_ in range(8):
        p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
        assert p.stdout is not None and p.stdout.readline() == b"go\n"
        time.sleep(0.05 + 0.07 * round_)
        p.send_signal(signal.SIGKILL)
        p.wait(60)
        if not (tmp_path / "doc").exists():
            continue
        data = (tmp_path / "doc").read_bytes()
        parts = data.split(b";")[:-1]
        assert len(parts) == 200000 and len(set(parts)) == 1, "torn"
    names = {p.name for p in tmp_path.iterdir()} - {"doc"}
    assert all(".tmp-" in n for n in names)     # at most a dead writer's temporaries, never under the name


def test_a_failed_sync_leaves_nothing_under_the_name(tmp_path, monkeypatch):
    files = _files(tmp_path)

    def broken(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", broken)
    with pytest.raises(StoreError, match="could not be written .*EIO.*nothing was stored"):
        files.write_bytes(files.join("x.json"), b"{}", cap=10)
    assert list(tmp_path.iterdir()) == []


def test_new_file_removes_a_file_that_outgrew_its_cap(tmp_path):
    files = _files(tmp_path)
    with pytest.raises(StoreError, match="more than the 10 its readers accept"):
        with files.new_file(files.join("d", "data.bin"), cap=10) as f:
            f.write(b"x" * 11)
    assert list((tmp_path / "d").iterdir()) == []


def test_flock_never_follows_a_link_and_leaves_a_user_file_untouched(tmp_path):
    victim = tmp_path / "notes.txt"
    victim.write_text("mine\n")
    (tmp_path / "x.lock").symlink_to(victim)
    files = _files(tmp_path)
    with pytest.raises(StoreError, match="symbolic link"):
        with files.flock(files.join("x.lock")):
            pass
    assert victim.read_text() == "mine\n"


def test_schema_refuses_retyped_and_non_finite_values():
    manifest = schema.Obj({"range": schema.Maybe(schema.List(schema.Float(), length=2)),
                           "shards": schema.Int(1, 2**40)}, extra=schema.Any_())
    assert schema.check({"range": None, "shards": 3, "x": [1]}, manifest)
    for bad, where in [({"range": True, "shards": 3}, "range"), ({"range": [0, 1e309], "shards": 3}, "range[1]"),
                       ({"range": [0, 1], "shards": True}, "shards"), ({"range": [0, 1], "shards": 2**41}, "shards"),
                       ({"range": [0, 1]}, "no 'shards'")]:
        with pytest.raises(schema.Invalid, match=where.replace("[", r"\[").replace("]", r"\]")):
            schema.check(bad, manifest)


def test_an_append_cut_short_by_a_full_disk_leaves_nothing_of_the_record(tmp_path, monkeypatch):
    """ENOSPC can come after the kernel took part of a record: that torn part is cut off again,
    so the next record is not glued to it (reproduced on a 64 KiB tmpfs)."""
    files = _files(tmp_path)
    fh = files.open_append(files.join("j.jsonl"), cap=1 << 20)
    try:
        fh.write(b'{"header":1}\n')
        real_write = os.write

        def full_after_some(fd, data):
            if fd != fh.fd:
                return real_write(fd, data)
            if len(data) > 4:
                return real_write(fd, bytes(data[:4]))        # the disk takes a little, then is full
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(os, "write", full_after_some)
        with pytest.raises(StoreError, match="ENOSPC.*nothing was written"):
            fh.write(b'{"record":2}\n')
        monkeypatch.undo()
        assert fh.size == 13
        fh.write(b'{"record":3}\n')
    finally:
        fh.close()
    assert (tmp_path / "j.jsonl").read_bytes() == b'{"header":1}\n{"record":3}\n'


def test_a_failed_append_never_cuts_off_another_writers_records(tmp_path, monkeypatch):
    """If another writer appended after this write's torn part (a holder that lost its lease
    while frozen), cutting back to this write's start would take that writer's records too:
    the torn part stays, and the error says so instead of "nothing was written"."""
    files = _files(tmp_path)
    fh = files.open_append(files.join("j.jsonl"), cap=1 << 20)
    other = os.open(tmp_path / "j.jsonl", os.O_WRONLY | os.O_APPEND)
    try:
        fh.write(b'{"header":1}\n')
        real_write = os.write
        calls = []

        def other_writer_then_full(fd, data):
            if fd != fh.fd:
                return real_write(fd, data)
            calls.append(len(data))
            if len(calls) == 1:
                return real_write(fd, bytes(data[:4]))
            real_write(other, b'{"theirs":1}\n')
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(os, "write", other_writer_then_full)
        with pytest.raises(StoreError, match="ENOSPC.*4 bytes of this record .* torn record") as caught:
            fh.write(b'{"record":2}\n')
        monkeypatch.undo()
        assert "nothing was written" not in str(caught.value)
    finally:
        os.close(other)
        fh.close()
    assert (tmp_path / "j.jsonl").read_bytes() == b'{"header":1}\n{"re{"theirs":1}\n'


def test_a_store_root_the_write_creates_is_synced_in_its_parents(tmp_path, synced):
    """The root itself, and every missing directory above it, is made with its name synced in
    its parent, as the directories below the root are."""
    root = tmp_path / "new" / "store"
    files = _files(root)
    assert files.write_bytes(files.join("doc.json"), b"{}", cap=10)
    for directory in (tmp_path, tmp_path / "new", root):
        assert directory.stat().st_ino in synced, directory


def test_a_root_that_is_a_dangling_link_is_named_as_one(tmp_path):
    (tmp_path / "store").symlink_to(tmp_path / "gone")
    files = _files(tmp_path / "store")
    with pytest.raises(StoreError, match=r"store: is a symbolic link to .*gone, which does not exist"):
        files.write_bytes(files.join("doc.json"), b"{}", cap=10)


def test_a_sandbox_that_forbids_renameat2_falls_back(monkeypatch):
    """seccomp answers a forbidden call with EPERM: that means "not here", like ENOSYS."""
    import ctypes

    from dask_research.durable import files as files_module

    def forbidden(*args):
        ctypes.set_errno(errno.EPERM)
        return -1

    monkeypatch.setattr(files_module, "_RENAMEAT2", forbidden)
    assert files_module._rename_noreplace(-1, "a", "b") is None


def test_each_directory_a_write_creates_is_synced_in_its_parent(tmp_path, synced):
    """A file synced into a new directory is lost to a power cut unless the new directory's
    name is synced too, in every parent a write created a directory in."""
    files = _files(tmp_path)
    assert files.write_bytes(files.join("runs", "ab12", "doc.json"), b"{}", cap=10)
    for directory in (tmp_path, tmp_path / "runs", tmp_path / "runs" / "ab12"):
        assert directory.stat().st_ino in synced, directory


def test_without_hard_links_of_two_racing_creators_one_wins(tmp_path, monkeypatch):
    """On a file system without hard links (vfat, some FUSE and SMB mounts) an exclusive create
    fell back to check-then-rename, and two racing creators both won (two lease holders). It
    now renames with RENAME_NOREPLACE: here the other creator's file appears between the check
    and the rename, and this one must lose without replacing it."""
    from dask_research.durable import files as files_module

    if files_module._RENAMEAT2 is None:
        pytest.skip("no renameat2 in this libc")

    def no_links(*args, **kwargs):
        raise OSError(errno.EPERM, "Operation not permitted")

    files = _files(tmp_path)
    real_lstat = files_module.Files._lstat_at

    def other_creator_wins_meanwhile(dir_fd, name):
        seen = real_lstat(dir_fd, name)
        if name == "lease.json" and seen is None:
            (tmp_path / "lease.json").write_bytes(b"theirs")       # right after this look
        return seen if name != "lease.json" else None

    monkeypatch.setattr(os, "link", no_links)
    monkeypatch.setattr(files_module.Files, "_lstat_at", staticmethod(other_creator_wins_meanwhile))
    assert files.write_bytes(files.join("lease.json"), b"ours", cap=100) is False
    assert (tmp_path / "lease.json").read_bytes() == b"theirs"
    assert [p.name for p in tmp_path.iterdir()] == ["lease.json"]        # no temporary left


def test_a_dangling_root_is_named_the_same_way_to_readers_and_writers(tmp_path):
    """Readers (`RunStore.require`, behind mc show/replay/verify) and writers (`Files.open_dir`)
    said the same fact in two wordings from two checks; there is one check now."""
    from dask_research.montecarlo.store import RunStore

    (tmp_path / "store").symlink_to(tmp_path / "gone")
    with pytest.raises(StoreError, match=r"store: is a symbolic link to .*gone, which does not exist; give the path"):
        RunStore(str(tmp_path / "store")).require()
    assert _files(tmp_path / "store").dangling_link(str(tmp_path / "store")).endswith("gone, which does not exist")
    assert _files(tmp_path).dangling_link(str(tmp_path)) is None


def test_messages_name_an_object_store_as_it_was_given_and_escape_control_characters():
    files = Files("memory://user:pw@bucket/a", error=StoreError)
    assert files.display(files.join("runs", "x")) == "memory://***@bucket/a/runs/x"
    assert Files("/tmp/a\x1b[2J", error=StoreError).display("/tmp/a\x1b[2J/b") == "/tmp/a\\x1b[2J/b"


def test_listdir_dirs_only_leaves_out_links_and_files(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "file").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "real", target_is_directory=True)
    files = _files(tmp_path)
    assert files.listdir(str(tmp_path)) == ["file", "link", "real"]
    assert files.listdir(str(tmp_path), dirs_only=True) == ["real"]
