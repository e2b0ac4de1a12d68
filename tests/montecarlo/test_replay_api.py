"""mc.replay as a user calls it: the short id the result prints, and messages that say what to do."""
import numpy as np
import pytest

from dask_research import montecarlo as mc
from dask_research.exceptions import StoreError


def twice(a):
    return 2 * a


def thrice(a):
    return 3 * a


@pytest.fixture
def stored(tmp_path):
    job = mc.Job(twice, {"a": mc.Normal(1.0, 0.1)}, shards=4, samples_per_shard=256, seed=1, name="twice")
    mc.run(job, store=str(tmp_path / "runs"), verify=0, progress=False)
    return job, str(tmp_path / "runs")


def test_replay_takes_the_short_id_the_result_prints(stored):
    job, store = stored
    for prefix in (job.id[:12], job.id[:5], job.id):
        report = mc.replay(prefix, shard=2, store=store)
        assert report.match and report.run_id == job.id
    assert all(r.match for r in mc.replay_many(job.id[:12], store, k=2))


@pytest.mark.parametrize("bad", ["zz", "", "41BB", "a" * 65])
def test_a_malformed_id_is_refused_in_one_line(stored, bad):
    _, store = stored
    with pytest.raises(StoreError, match=r"is not a run id or a prefix of one|has no run starting with"):
        mc.replay(bad, shard=0, store=store)


def test_the_wrong_job_is_told_what_the_run_recorded(stored):
    job, store = stored
    other = mc.Job(thrice, {"a": mc.Normal(1.0, 0.1)}, shards=4, samples_per_shard=256, seed=1)
    with pytest.raises(StoreError) as e:
        mc.replay(job.id[:12], shard=0, store=store, job=other)
    msg = str(e.value)
    assert "is not the one that ran" in msg and "'twice'" in msg and "4 shards of 256 samples, seed 1" in msg
    assert "\n" not in msg
    assert np.isfinite(mc.replay(job.id[:12], shard=0, store=store, job=job).recomputed.mean)


def test_replay_many_reads_the_store_and_the_job_once_for_k_shards(stored, monkeypatch):
    """Issue 28: ``mc verify -k K`` re-read every shard file and reloaded the job for each of the K
    replays (0.33 s a shard on a 512-file store). Now K replays read each once."""
    from dask_research.montecarlo import audit

    job, store = stored
    reads = {"shards": 0, "jobs": 0}
    read_shards, load_job = mc.RunStore.read_shards, audit.load_job

    def counting_read_shards(self, *a, **kw):
        reads["shards"] += 1
        return read_shards(self, *a, **kw)

    def counting_load_job(*a, **kw):
        reads["jobs"] += 1
        return load_job(*a, **kw)

    monkeypatch.setattr(mc.RunStore, "read_shards", counting_read_shards)
    monkeypatch.setattr(audit, "load_job", counting_load_job)
    reports = mc.replay_many(job.id[:12], store, k=4)
    assert sorted(r.shard for r in reports) == [0, 1, 2, 3] and all(r.match for r in reports)
    assert reads == {"shards": 1, "jobs": 1}, reads
