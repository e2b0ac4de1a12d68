"""Audit of a hostile journal: a record repeated (by a faulty copy, a sync tool, a hand edit)
must be refused on resume, naming the file, never replayed twice (a paper triggered twice was
written twice on resume)."""
from __future__ import annotations

import json
import re

import pytest

from dask_research.exceptions import CheckpointError
from dask_research.experiments import Hypothesis, IterationScheduler
from dask_research.experiments.checkpoint import _encode
from dask_research.testing.experiments import resume_quietly


def journal(path) -> list[bytes]:
    """A journal of an ask/tell session in which branch 'a' triggered the paper stage (no
    writer: the trigger waits for one) and one ask is pending; its lines."""
    sched = IterationScheduler(None, progress=False, checkpoint=path, prune_after_runs=100,
                               paper_threshold=0.5)
    sched.add([Hypothesis(f"{b}{k}", b) for k in range(3) for b in "ab"])
    h = sched.ask()
    sched.tell(h, 0.6)
    sched.ask()
    sched.close()
    return [line + b"\n" for line in path.read_bytes().split(b"\n") if line]


def kind(line: bytes) -> str | None:
    rec = json.loads(line)
    return rec["e"]["kind"] if rec.get("kind") == "event" else None


resume = resume_quietly


@pytest.mark.timeout(60, method="thread")
def test_a_repeated_paper_trigger_is_refused_and_no_paper_is_written_twice(tmp_path):
    path = tmp_path / "loop.jsonl"
    lines = journal(path)
    k = next(i for i, line in enumerate(lines) if kind(line) == "paper.trigger")
    path.write_bytes(b"".join(lines[:k + 1] + [lines[k]] + lines[k + 1:]))
    written = []

    def writer(branch, stats, best):
        written.append(branch)
        return "paper"

    with pytest.raises(CheckpointError, match=rf"checkpoint {re.escape(str(path))}: record {k + 2} does not fit the state "
                                              r"before it \(ValueError: event number \d+ follows event \d+"):
        resume(path, runner=lambda h: 0.5, paper_writer=writer)
    assert written == []
    # the same trigger again under the next number (its checksum recomputed): still refused
    rec = json.loads(lines[k])
    rec.pop("crc")
    rec.pop("more", None)
    rec["e"]["seq"] += 1
    later = [json.loads(line) for line in lines[k + 1:]]
    for r in later:
        r.pop("crc")
        if r.get("kind") == "event":
            r["e"]["seq"] += 1
    tail = [(_encode(r) + "\n").encode() for r in [rec, *later]]
    path.write_bytes(b"".join(lines[:k + 1] + tail))
    with pytest.raises(CheckpointError, match=r"a second paper trigger of branch 'a'"):
        resume(path, runner=lambda h: 0.5, paper_writer=writer)
    assert written == []


@pytest.mark.timeout(60, method="thread")
@pytest.mark.parametrize("what", ["dispatch", "result"])
def test_a_repeated_decision_or_result_is_refused_naming_the_file(tmp_path, what):
    path = tmp_path / "loop.jsonl"
    lines = journal(path)
    k = max(i for i, line in enumerate(lines) if kind(line) == what)
    path.write_bytes(b"".join(lines[:k + 1] + [lines[k]] + lines[k + 1:]))
    with pytest.raises(CheckpointError, match=rf"checkpoint {re.escape(str(path))}: record {k + 2} does not fit"):
        resume(path)


@pytest.mark.timeout(60, method="thread")
def test_an_untouched_journal_still_resumes(tmp_path):
    """The numbering check accepts what the live loop writes: a run, a second run of the same
    scheduler (its trace starts again at 0) and a resumed run (numbered on from the journal)."""
    path = tmp_path / "loop.jsonl"
    sched = IterationScheduler(lambda h: 0.5, slots=2, progress=False, checkpoint=path,
                               max_experiments=3)
    sched.add([Hypothesis(f"{b}{k}", b) for k in range(4) for b in "ab"])
    sched.run()
    sched.run()                              # a second run: its events are numbered from 0
    again = resume(path, runner=lambda h: 0.5, progress=False, max_experiments=None)
    assert again.run().total_runs == 8
    final = resume(path, runner=lambda h: 0.5, progress=False)
    assert sum(s.runs for s in final.stats.values()) == 8


@pytest.mark.timeout(60, method="thread")
@pytest.mark.parametrize("record", [
    {"kind": "output", "branch": "b", "output": "a paper from elsewhere"},
    {"kind": "output", "branch": "zzz", "output": "a paper from another study"},
])
def test_a_paper_for_a_branch_that_never_triggered_is_refused(tmp_path, record):
    """A paper output record is written only after its branch's trigger: one without (copied
    from another journal) used to be restored silently into report.papers."""
    path = tmp_path / "loop.jsonl"
    lines = journal(path)
    path.write_bytes(b"".join(lines) + (_encode(record) + "\n").encode())
    with pytest.raises(CheckpointError, match=rf"record {len(lines) + 1} does not fit the state before it "
                                              rf"\(ValueError: a paper outcome for branch '{record['branch']}', "
                                              "which never triggered"):
        resume(path)
    ok = {"kind": "output", "branch": "a", "output": "the paper of a"}
    path.write_bytes(b"".join(lines) + (_encode(ok) + "\n").encode())
    assert resume(path)._books.papers == {"a": "the paper of a"}
