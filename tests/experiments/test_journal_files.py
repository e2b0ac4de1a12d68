"""The journal's files through the durable layer, on real files: nothing but a journal is read or
written, reads are bounded by caps the writer enforces, nothing blocks or runs out of memory.

Every call that could hang on a regression runs in a thread with a generous bound.
"""
import json
import os
import pickle
import subprocess
import sys
import zlib

import dask
import pytest

from dask_research.exceptions import CheckpointError, ConfigError, ExperimentError
from dask_research.experiments import Hypothesis, IterationScheduler
from dask_research.experiments.checkpoint import Journal, _encode
from dask_research.testing.threads import in_thread

BOUND = 120.0

USER_FILES = {
    "text": b"my precious notes, no newline at the end",
    "json": b'{"format": "something else", "x": 1}',
    "lines": b"line one\nline two\n",
    "pickle": pickle.dumps({"kind": "hyps"}),
}


def _build(path, **kw):
    return IterationScheduler(lambda h: 0.5, progress=False, checkpoint=path, **kw)


def _bounded(fn):
    """``fn()`` in a thread; its error (it must raise), failing instead of hanging."""
    t, out = in_thread(fn, join=BOUND)
    assert not t.is_alive(), f"still blocked after {BOUND} s"
    assert "error" in out, f"accepted: {out}"
    return out["error"]


@pytest.mark.parametrize("kind", sorted(USER_FILES))
def test_a_checkpoint_that_is_not_a_journal_is_refused_and_left_untouched(tmp_path, kind):
    path = tmp_path / "notes.txt"
    path.write_bytes(USER_FILES[kind])
    for attempt in (lambda: _build(path), lambda: IterationScheduler.resume(path, lambda h: 0.5)):
        with pytest.raises(CheckpointError, match=rf"checkpoint {path}: .*(not an experiments journal|not valid "
                                                  r"JSON|not a UTF-8 JSON-lines journal)"):
            attempt()
        assert path.read_bytes() == USER_FILES[kind]
    sched = _build(tmp_path / "j.jsonl")               # a fresh journal elsewhere still works
    sched.add([Hypothesis("h1", "a")])
    assert sched.run().total_runs == 1


@pytest.mark.parametrize("target", ["user-file", "journal"])
def test_a_checkpoint_that_is_a_symlink_is_refused_and_its_target_untouched(tmp_path, target):
    real = tmp_path / "real.jsonl"
    if target == "journal":
        sched = _build(real)
        sched.add([Hypothesis("h1", "a")])
        sched.run()
    else:
        real.write_bytes(USER_FILES["text"])
    before = real.read_bytes()
    link = tmp_path / "loop.jsonl"
    link.symlink_to(real)
    with pytest.raises(CheckpointError, match=rf"checkpoint {link}: is a symbolic link; links inside it are "
                                              r"refused, never followed .*point at the link's target instead"):
        _build(link)
    with pytest.raises(CheckpointError, match="is a symbolic link"):
        IterationScheduler.resume(link, lambda h: 0.5)
    assert real.read_bytes() == before


def test_the_journals_folder_may_be_a_link(tmp_path):
    """Where you chose to put it: only links below the folder are refused."""
    (tmp_path / "scratch").mkdir()
    (tmp_path / "runs").symlink_to(tmp_path / "scratch")
    sched = _build(tmp_path / "runs" / "loop.jsonl", max_experiments=1)
    sched.add([Hypothesis("h1", "a"), Hypothesis("h2", "a")])
    sched.run()
    assert (tmp_path / "scratch" / "loop.jsonl").is_file()
    report = IterationScheduler.resume(tmp_path / "runs" / "loop.jsonl", lambda h: 0.5, progress=False,
                                       max_experiments=None).run()
    assert report.replayed == 1 and report.total_runs == 2


@pytest.mark.timeout(300, method="thread")
def test_a_journal_that_is_a_fifo_is_refused_at_once(tmp_path):
    path = tmp_path / "loop.jsonl"
    os.mkfifo(path)
    for attempt in (lambda: _build(path), lambda: IterationScheduler.resume(path, lambda h: 0.5),
                    lambda: Journal(path).load()):
        err = _bounded(attempt)
        assert isinstance(err, CheckpointError), err
        assert str(err).startswith(f"checkpoint {path}: is a FIFO, not a regular file; refused before reading")


ZERO = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))    # a regression runs out here, not the machine
from dask_research.exceptions import CheckpointError
from dask_research.experiments import IterationScheduler
for attempt in (lambda: IterationScheduler(lambda h: 0.5, progress=False, checkpoint=sys.argv[1]),
                lambda: IterationScheduler.resume(sys.argv[1], lambda h: 0.5)):
    try:
        attempt()
    except CheckpointError as exc:
        print("REFUSED", exc, flush=True)
"""


def test_a_journal_linked_to_dev_zero_is_refused_before_reading(tmp_path):
    """In a process of its own, its memory and time bounded: a regression fails, it cannot hang."""
    path = tmp_path / "loop.jsonl"
    path.symlink_to("/dev/zero")
    proc = subprocess.run([sys.executable, "-c", ZERO, str(path)], capture_output=True, text=True,
                          timeout=BOUND)
    assert proc.returncode == 0, proc.stderr[-2000:]
    refused = proc.stdout.splitlines()
    assert len(refused) == 2 and all(line.startswith(f"REFUSED checkpoint {path}: is a symbolic link")
                                     for line in refused), proc.stdout


def test_a_journal_that_is_a_directory_is_refused(tmp_path):
    path = tmp_path / "loop.jsonl"
    path.mkdir()
    with pytest.raises(CheckpointError, match=rf"checkpoint {path}: is a directory, not a regular file"):
        _build(path)


def test_an_empty_file_is_a_journal_with_nothing_in_it_yet(tmp_path):
    path = tmp_path / "loop.jsonl"
    path.write_bytes(b"")
    sched = _build(path)
    sched.add([Hypothesis("h1", "a")])
    assert sched.run().total_runs == 1
    assert path.read_bytes().startswith(b'{"format": "dask-research.experiments.journal", "version": 3')


def test_a_torn_header_is_a_journal_with_nothing_in_it_yet(tmp_path):
    path = tmp_path / "loop.jsonl"
    path.write_bytes(b'{"format": "dask-research.experiments.journal", "version": 3, "sett')   # crash
    sched = _build(path)
    sched.add([Hypothesis("h1", "a")])
    assert sched.run().total_runs == 1
    assert len(Journal(path).load().records) > 1


def test_a_record_longer_than_the_line_cap_is_refused_before_writing(tmp_path):
    path = tmp_path / "loop.jsonl"
    with dask.config.set({"research.experiments.journal-max-line-bytes": 4096}):
        sched = _build(path)
        sched.add([Hypothesis("small", "a", {"x": 1})])
        before = path.read_bytes()
        with pytest.raises(CheckpointError, match=r"not written: a 'hyps' record of [\d,]+ bytes, more than the "
                                                  r"4,096 a journal line may have \(research.experiments.journal-"
                                                  r"max-line-bytes\); add fewer hypotheses at a time"):
            sched.add([Hypothesis(f"big{k}", "a", {"blob": "x" * 100}) for k in range(100)])
        assert path.read_bytes() == before                     # nothing written
        assert sched.stats["a"].queued == 1                    # nothing queued
        assert sched.run().total_runs == 1
    # the reader refuses what the writer would: a line over the cap
    lines = path.read_bytes().split(b"\n")
    rec = json.loads(lines[1])
    rec.pop("crc")
    rec["hyps"][0]["payload"] = {"pad": "y" * 5000}
    lines[1] = _encode(rec).encode()
    path.write_bytes(b"\n".join(lines))
    with dask.config.set({"research.experiments.journal-max-line-bytes": 4096}):
        with pytest.raises(CheckpointError, match=r"line 2 is [\d,]+ bytes, more than the 4,096 a journal line may "
                                                  r"have \(research.experiments.journal-max-line-bytes\)"):
            Journal(path).load()
    assert len(Journal(path).load().records) == len(lines) - 2     # within the default cap


def test_a_journal_at_its_size_cap_stops_the_run_and_resumes_with_a_larger_one(tmp_path):
    path = tmp_path / "loop.jsonl"
    with dask.config.set({"research.experiments.journal-max-bytes": 20_000}):
        sched = _build(path, slots=1)
        sched.add([Hypothesis(f"h{k}", "a") for k in range(200)])
        with pytest.raises(CheckpointError, match=r"not written: the journal would grow to [\d,]+ bytes, more than "
                                                  r"the 20,000 its readers accept \(research.experiments.journal-"
                                                  r"max-bytes\); raise it and resume to go on"):
            sched.run()
        assert path.stat().st_size <= 20_000
        with pytest.raises(CheckpointError, match="raise it and resume"):
            IterationScheduler.resume(path, lambda h: 0.5, progress=False).run()
    with dask.config.set({"research.experiments.journal-max-bytes": 10_000}):
        with pytest.raises(CheckpointError, match=r"is [\d,]+ bytes, more than the 10,000 a journal may have "
                                                  r"\(research.experiments.journal-max-bytes\)"):
            Journal(path).load()
    report = IterationScheduler.resume(path, lambda h: 0.5, progress=False).run()
    assert report.total_runs == 200 and report.replayed > 0


def test_records_the_reader_would_refuse_are_never_written(tmp_path):
    path = tmp_path / "loop.jsonl"
    sched = _build(path)
    sched.add([Hypothesis("h1", "a")])
    before = path.read_bytes()
    deep: object = 1
    for _ in range(100):
        deep = [deep]
    with pytest.raises(ExperimentError, match=r"the payload of hypothesis 'deep' is nested more than 61 levels"):
        sched.add([Hypothesis("deep", "a", deep)])
    with pytest.raises(CheckpointError, match=r"not written: a 'hyps' record that holds an integer of 400 digits"):
        sched.add([Hypothesis("giant", "a", {"n": 10 ** 399})])
    assert path.read_bytes() == before and sched.stats["a"].queued == 1


def test_a_nan_literal_in_a_resigned_record_is_refused(tmp_path):
    path = tmp_path / "loop.jsonl"
    sched = _build(path)
    sched.add([Hypothesis("h1", "a", {"x": 1})])
    sched.run()
    lines = path.read_text().splitlines()
    body = lines[1][:lines[1].rindex(', "crc"')] + "}"        # the record without its checksum
    body = body.replace('{"x": 1}', '{"x": NaN}')
    lines[1] = body[:-1] + f', "crc": "{zlib.crc32(body.encode()):08x}"}}'
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(CheckpointError, match=r"line 2 holds NaN, which is not JSON"):
        IterationScheduler.resume(path, lambda h: 0.5, progress=False)


@pytest.mark.parametrize("value", ["lots", 0, -1, 2.5, True])
def test_a_bad_journal_cap_setting_is_one_clear_error(tmp_path, value):
    with dask.config.set({"research.experiments.journal-max-bytes": value}):
        # the schema's type check (2.5, True), or the journal's own check ("lots", 0, -1)
        with pytest.raises(ConfigError, match=r"research.experiments.journal-max-bytes=.* is invalid; expected (a "
                                              r"size in bytes > 0|a string or an integer \(research-schema.yaml\))"):
            _build(tmp_path / "loop.jsonl")
    assert not (tmp_path / "loop.jsonl").exists()


def test_a_remote_journal_is_rewritten_whole_within_its_cap(tmp_path):
    fsspec = pytest.importorskip("fsspec")
    url = "memory://dask-research-caps/loop.jsonl"
    fs = fsspec.filesystem("memory")
    if fs.exists(url):
        fs.rm(url)
    with dask.config.set({"research.experiments.journal-max-bytes": 20_000}):
        sched = _build(url, slots=1)
        sched.add([Hypothesis(f"h{k}", "a") for k in range(200)])
        with pytest.raises(CheckpointError, match="raise it and resume"):
            sched.run()
    assert len(fs.cat_file(url)) <= 20_000
    report = IterationScheduler.resume(url, lambda h: 0.5, progress=False).run()
    assert report.total_runs == 200
    assert not [p for p in fs.ls("/dask-research-caps", detail=False) if ".tmp-" in p or p.endswith(".lease")]
    fs.rm(url)
