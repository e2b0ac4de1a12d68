"""Bad arguments to the read commands (mc show, mc replay, mc verify) are usage errors: exit 2, one line."""
import pytest
from click.testing import CliRunner

from dask_research.cli import main

from .test_store import job_module, one_worker  # noqa: F401 - fixtures

RUN_A = "a8ce" + "0" * 60
RUN_B = "a8ce" + "1" * 60

COMMANDS = [["mc", "show", "a8ce"], ["mc", "replay", "a8ce", "--shard", "0"], ["mc", "verify", "a8ce", "-k", "2"]]


def _usage_error(args, *expected):
    out = CliRunner().invoke(main, args)
    assert out.exit_code == 2, out.output
    lines = out.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.output, out.output
    for text in expected:
        assert text in lines[0], out.output
    return lines[0]


@pytest.mark.parametrize("command", COMMANDS)
def test_a_store_that_does_not_exist_is_a_usage_error(tmp_path, command):
    _usage_error(command + ["--store", str(tmp_path / "nope")], "--store", "nope: does not exist")


@pytest.mark.parametrize("command", COMMANDS)
def test_a_store_that_is_a_file_is_a_usage_error(tmp_path, command):
    f = tmp_path / "afile"
    f.write_text("x")
    _usage_error(command + ["--store", str(f)], "--store", "afile: is a file")


@pytest.mark.parametrize("command", COMMANDS)
def test_a_store_that_is_a_dangling_link_is_named_as_one(tmp_path, command):
    link = tmp_path / "dl"
    link.symlink_to(tmp_path / "gone")
    _usage_error(command + ["--store", str(link)], "--store", "is a symbolic link to", "gone, which does not exist")


def test_a_missing_object_store_prefix_is_a_usage_error():
    """Named as the user typed it: fsspec's own spelling of the path was "/audit-read-args-none"."""
    _usage_error(["mc", "show", "--store", "memory://audit-read-args-none"], "--store",
                 "memory://audit-read-args-none: does not exist")


@pytest.mark.parametrize("command", COMMANDS)
def test_a_store_name_with_terminal_escapes_cannot_drive_the_terminal(tmp_path, command):
    hostile = tmp_path / "store\x1b[2J\nmean 42"
    hostile.write_text("x")
    line = _usage_error(command + ["--store", str(hostile)], "--store", "is a file", "\\x1b[2J\\nmean 42")
    assert "\x1b" not in line


def test_a_linked_run_directory_is_not_listed_or_matched(tmp_path, job_module):
    """A symbolic link in runs/ named like a run was counted by `mc show` and matched as a prefix,
    then refused when opened; it is left out with one warning."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "store" / "runs").mkdir(parents=True)
    (tmp_path / "store" / "runs" / RUN_A).symlink_to(elsewhere, target_is_directory=True)
    (tmp_path / "store" / "runs" / RUN_B).mkdir()
    out = CliRunner().invoke(main, ["mc", "show", "--store", str(tmp_path / "store")])
    assert out.exit_code == 0, out.output
    assert "1 run in" in out.output and RUN_B in out.output and f"  {RUN_A}" not in out.output
    assert out.output.count("a symbolic link, not a run; ignored") == 1


@pytest.mark.parametrize("command", COMMANDS)
def test_a_run_prefix_two_runs_share_is_a_usage_error(tmp_path, command):
    for rid in (RUN_A, RUN_B):
        (tmp_path / "runs" / rid).mkdir(parents=True)
    _usage_error(command + ["--store", str(tmp_path)], "RUN", "2 runs start with 'a8ce'; give more characters")


@pytest.mark.parametrize("command", COMMANDS)
def test_a_run_that_is_not_a_hex_prefix_is_a_usage_error(tmp_path, command):
    (tmp_path / "runs").mkdir()
    args = [("XYZ" if a == "a8ce" else a) for a in command]
    _usage_error(args + ["--store", str(tmp_path)], "RUN", "'XYZ' is not a run id or a prefix of one")


def test_a_prefix_no_run_starts_with_stays_a_failure(tmp_path):
    (tmp_path / "runs" / RUN_A).mkdir(parents=True)
    out = CliRunner().invoke(main, ["mc", "show", "ffff", "--store", str(tmp_path)])
    assert out.exit_code == 1 and "has no run starting with 'ffff'" in out.output


# -- replaying a few shards reads only the files that hold them --------------------------------
@pytest.mark.timeout(300, method="thread")
def test_replay_and_verify_read_only_the_shard_files_holding_the_shards(tmp_path, job_module, one_worker,
                                                                         monkeypatch):
    """mc replay of one shard read (and so could be stopped by) every shard file of the run."""
    from dask_research import montecarlo as mc
    from dask_research.exceptions import StoreError
    from dask_research.montecarlo.store import StoreFiles

    path, job = job_module
    store = tmp_path / "store"
    mc.run(job, client=one_worker, store=str(store), progress=False, shards_per_task=4, verify=0)
    shards = store / "runs" / job.id / "shards"
    torn = shards / "000000000008-000000000012.json"
    torn.write_bytes(torn.read_bytes()[:100])           # a torn file, holding shards 8-11 only
    read = []
    real = StoreFiles.read_json
    monkeypatch.setattr(StoreFiles, "read_json", lambda self, p: (read.append(p.rsplit("/", 1)[-1]), real(self, p))[1])
    assert mc.replay(job.id, 3, str(store), job=job).match
    assert [n for n in read if n != "manifest.json"] == ["000000000000-000000000004.json"]
    read.clear()
    assert all(r.match for r in mc.replay_many(job.id, str(store), shards=[1, 2, 17], job=job))
    assert [n for n in read if n != "manifest.json"] == ["000000000000-000000000004.json",
                                                         "000000000016-000000000020.json"]
    with pytest.raises(StoreError, match="000000000008-000000000012.json: is not valid JSON"):
        mc.replay(job.id, 9, str(store), job=job)
    monkeypatch.chdir(tmp_path)
    out = CliRunner().invoke(main, ["mc", "verify", job.id[:8], "--store", str(store), "--shards", "0,23",
                                    "--job", f"{path}:job"])
    assert out.exit_code == 0 and "2 of 2 shards reproduced exactly" in out.output, out.output


# -- what the read commands say they checked ----------------------------------------------------
@pytest.mark.timeout(300, method="thread")
def test_verify_and_show_say_what_was_not_checked(tmp_path, job_module, one_worker, monkeypatch):
    """mc verify printed "3 of 3 shards reproduced exactly" for 3 of 24 shards, and mc show printed
    the run's own verification record from result.json as if show had verified anything."""
    from dask_research import montecarlo as mc

    path, job = job_module
    store = str(tmp_path / "store")
    mc.run(job, client=one_worker, store=store, progress=False)
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    base = ["mc", "verify", job.id[:8], "--store", store, "--job", f"{path}:job"]
    out = runner.invoke(main, base + ["--shards", "1,2,23"])
    assert out.exit_code == 0, out.output
    assert "3 of 3 shards reproduced exactly (a sample: 3 of the run's 24 shards re-run, the other 21 not checked)" \
        in out.output
    out = runner.invoke(main, base + ["-k", "100"])
    assert out.exit_code == 0 and "24 of 24 shards reproduced exactly (every shard of the run)" in out.output
    out = runner.invoke(main, ["mc", "show", job.id[:8], "--store", store])
    line = [x for x in out.output.splitlines() if x.strip().startswith("verified")]
    assert out.exit_code == 0 and len(line) == 1, out.output
    assert "(as the run recorded it; not re-run by show: mc verify RUN re-runs shards)" in line[0]


@pytest.fixture
def stored(tmp_path, job_module, one_worker):
    """``(job, store)``: the test job run once into ``tmp_path/store`` on one worker, unverified."""
    from dask_research import montecarlo as mc

    _, job = job_module
    store = tmp_path / "store"
    mc.run(job, client=one_worker, store=str(store), progress=False, verify=0)
    return job, store


@pytest.mark.timeout(300, method="thread")
def test_a_store_warning_of_a_read_command_is_one_line(stored):
    """A foreign file in shards/ printed Python's two-line warning: this package's source path and
    line number, then the line of code ('for path in self.shard_files(run_id):')."""
    job, store = stored
    (store / "runs" / job.id / "shards" / "notes.json~").write_text("x")
    out = CliRunner().invoke(main, ["mc", "show", job.id[:8], "--store", str(store)])
    assert out.exit_code == 0, out.output
    warned = [x for x in out.output.splitlines() if "notes.json~" in x]
    assert warned == [f"Warning: {store}/runs/{job.id}/shards/notes.json~: not a shard file (foreign name); ignored"], \
        out.output
    assert "self.shard_files" not in out.output and "runstore.py" not in out.output, out.output


@pytest.mark.timeout(300, method="thread")
def test_verify_k_of_an_incomplete_run_checks_stored_shards(tmp_path, job_module, one_worker):
    """mc verify -k K on a run to resume failed on the first hashed shard not stored yet, checking none."""
    from dask_research import montecarlo as mc
    from dask_research.exceptions import StoreError
    from dask_research.montecarlo.verify import hash_order

    path, job = job_module
    store = tmp_path / "store"
    mc.run(job, client=one_worker, store=str(store), progress=False, shards_per_task=4, verify=0)
    assert [r.shard for r in mc.replay_many(job.id, str(store), k=4, job=job)] == hash_order(job.id, 24, 4)
    first = hash_order(job.id, 24, 1)[0] // 4 * 4
    (store / "runs" / job.id / "shards" / f"{first:012d}-{first + 4:012d}.json").unlink()
    reports = mc.replay_many(job.id, str(store), k=4, job=job)
    picks = [r.shard for r in reports]
    assert len(picks) == 4 and all(r.match for r in reports)
    assert picks == [s for s in hash_order(job.id, 24) if not first <= s < first + 4][:4]
    assert len(mc.replay_many(job.id, str(store), k=100, job=job)) == 20
    # the summary counts what the run holds, not the shards it never computed ("the other 22 not checked")
    out = CliRunner().invoke(main, ["mc", "verify", job.id[:12], "-k", "2", "--store", str(store), "--job",
                                    f"{path}:job"])
    assert out.exit_code == 0, out.output
    assert "(a sample: 2 of the 20 shards this incomplete run has stored (20 of 24) re-run, the other 18 not " \
           "checked)" in out.output, out.output
    for f in (store / "runs" / job.id / "shards").iterdir():
        f.unlink()
    with pytest.raises(StoreError, match="holds no stored shard to verify"):
        mc.replay_many(job.id, str(store), k=4, job=job)


@pytest.mark.timeout(300, method="thread")
def test_show_prints_a_hostile_manifest_name_on_its_own_line_escaped(stored):
    """A manifest's name (checksummed, but anyone can recompute the checksum) with newlines forged
    whole lines of mc show ("mean 42 (recomputed from the stored shards)"), and terminal escapes
    reached the terminal."""
    import json

    from dask_research.montecarlo.store import checksum

    job, store = stored
    mpath = store / "runs" / job.id / "manifest.json"
    doc = json.loads(mpath.read_text())
    doc["name"] = "x)\n  mean 42 (recomputed from the stored shards)\n\x1b[2J"
    doc["created"] = "2026\r\x1b]0;owned\x07"
    doc["checksum"] = checksum({k: v for k, v in doc.items() if k != "checksum"})
    mpath.write_text(json.dumps(doc))
    out = CliRunner().invoke(main, ["mc", "show", job.id[:8], "--store", str(store)], color=True)
    assert out.exit_code == 0, out.output
    assert not any(x.strip().startswith("mean 42") for x in out.stdout.splitlines()), out.stdout
    assert "\x1b" not in out.stdout and "\r" not in out.stdout and "\x07" not in out.stdout
    assert out.stdout.splitlines()[0] == (f"run {job.id} (x)\\n  mean 42 (recomputed from the stored shards)\\n"
                                          "\\x1b[2J), created 2026\\r\\x1b]0;owned\\x07")


@pytest.mark.timeout(300, method="thread")
def test_a_foreign_file_name_with_a_newline_stays_on_its_warning_line(stored):
    job, store = stored
    (store / "runs" / job.id / "shards" / "n\n  mean 42\x1b[2J").write_text("x")
    out = CliRunner().invoke(main, ["mc", "show", job.id[:8], "--store", str(store)])
    assert out.exit_code == 0, out.output
    assert not any(x.strip().startswith("mean 42") for x in out.output.splitlines()), out.output
    assert "\x1b" not in out.output and "shards/n\\n  mean 42\\x1b[2J: not a shard file" in out.output, out.output


def test_k_with_shards_is_a_usage_error_not_silently_ignored(tmp_path):
    (tmp_path / "runs").mkdir()
    _usage_error(["mc", "verify", "a8ce", "-k", "3", "--shards", "1", "--store", str(tmp_path)],
                 "-k and --shards exclude each other")


@pytest.mark.timeout(300, method="thread")
@pytest.mark.parametrize("command", [["mc", "replay", "--shard", "1"], ["mc", "verify", "-k", "2"]])
def test_replay_or_verify_without_the_job_is_a_short_usage_error(stored, command):
    """It exited 1 with a 400-character line; without --job (or --trust-origin) it cannot work."""
    from dask_research.montecarlo.job_registry import JOBS

    job, store = stored
    JOBS.clear()                 # as in a fresh command's process: no job built there
    line = _usage_error(command[:2] + [job.id[:12]] + command[2:] + ["--store", str(store)], "--job",
                        "give --job FILE:JOB", "--trust-origin")
    assert len(line) < 400, line


@pytest.mark.timeout(300, method="thread")
def test_the_listing_tells_runs_apart(stored):
    """`mc show --store` listed bare 64-character ids: no name, date or completeness."""
    import shutil

    job, store = stored
    shards = store / "runs" / job.id / "shards"
    first = sorted(shards.glob("*.json"))[0]
    shutil.move(str(first), str(store / "aside.json"))          # as if the run stopped before it
    out = CliRunner().invoke(main, ["mc", "show", "--store", str(store)])
    assert out.exit_code == 0, out.output
    line = next(ln for ln in out.output.splitlines() if job.id in ln)
    assert job.name in line and ", created 20" in line and "incomplete: run it again to resume" in line, line
    assert f" of {job.shards} shards stored" in line
