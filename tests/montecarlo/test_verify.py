import pathlib
import time

import numpy as np
import pytest
from distributed import Client, LocalCluster
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dask_research import montecarlo as mc
from dask_research._cluster import workers_info
from dask_research.montecarlo.verify import choose_shards, hash_order


def corruptible(a, b):
    """Correct everywhere except on a worker flagged `corrupt_results` (a faulty machine)."""
    y = np.tanh(a * b)
    try:
        from distributed import get_worker

        if getattr(get_worker(), "corrupt_results", False):
            y = y + 1e-9
    except ValueError:  # not on a worker: the pilot, the client's referee
        pass
    return y


def sluggish(a, b):
    """Correct everywhere; very slow on a worker flagged `slow`."""
    try:
        from distributed import get_worker

        if getattr(get_worker(), "slow", False):
            time.sleep(2.0)
    except ValueError:
        pass
    return np.tanh(a * b)


def _job(fn, shards=32):
    return mc.Job(fn, {"a": mc.Normal(1, 0.1), "b": mc.Normal(2, 0.2)}, shards=shards,
                  samples_per_shard=1024, seed=77, bins=32)


@pytest.fixture
def two_workers(loop):
    with LocalCluster(loop=loop, n_workers=2, threads_per_worker=1, processes=False,
                      dashboard_address=None) as cl, Client(cl, set_as_default=False) as c:
        yield c


def _flag(client, worker, attr):
    def set_flag(dask_worker, attr=attr):
        setattr(dask_worker, attr, True)

    client.run(set_flag, workers=[worker])


def test_checks_run_on_a_different_worker_with_distinct_keys(two_workers):
    res = mc.run(_job(corruptible), client=two_workers, verify=4, progress=False, shards_per_task=2)
    v = res.verification
    assert len(v["checked"]) >= 4 and v["mismatches"] == [] and v["quarantined_workers"] == []
    assert all(c["match"] and not c["same_worker"] and c["producer"] != c["verifier"] for c in v["checked"])
    assert {c["producer"] for c in v["checked"]} == set(res.workers)  # every producer was checked


def test_a_corrupting_worker_is_caught_quarantined_and_its_shards_recomputed(two_workers, tmp_path):
    clean = mc.run(_job(corruptible), client=two_workers, verify=0, progress=False, shards_per_task=2)
    bad = sorted(workers_info(two_workers))[1]
    _flag(two_workers, bad, "corrupt_results")
    res = mc.run(_job(corruptible), client=two_workers, verify=2, progress=False, shards_per_task=2,
                 store=str(tmp_path))
    v = res.verification
    assert v["quarantined_workers"] == [bad]
    assert v["mismatches"] and all(m["faulty"] == [bad] for m in v["mismatches"])
    assert v["recomputed_shards"] == res.workers[bad] > 0
    assert res.state == clean.state                     # the accepted result is the clean one
    quarantined = list((tmp_path / "runs" / res.run_id / "quarantine").glob("*.json"))
    assert quarantined                                   # moved aside, not deleted
    stored = mc.RunStore(str(tmp_path)).read_shards(res.run_id)
    assert len(stored) == 32 and all(w != bad for _, w, _ in stored.values())
    assert "quarantined" in str(res) or "mismatched" in str(res)


def test_verification_can_be_switched_off(two_workers):
    res = mc.run(_job(corruptible), client=two_workers, verify=0, progress=False)
    assert res.verification is None


def test_a_straggler_is_duplicated_and_the_result_is_unchanged(two_workers):
    reference = mc.run(_job(sluggish, 16), client=two_workers, verify=0, progress=False, shards_per_task=1)
    slow = sorted(workers_info(two_workers))[0]
    _flag(two_workers, slow, "slow")
    res = mc.run(_job(sluggish, 16), client=two_workers, verify=0, progress=False, shards_per_task=1,
                 speculate=3.0)
    assert res.state == reference.state
    assert any(s["speculative_won"] for s in res.speculated), res.speculated
    # Nowhere near "every block on the slow worker" (read from the run's record, not the clock).
    assert res.workers.get(slow, 0) < 16 // 2, res.workers


@pytest.mark.slow
@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])   # a shared machine: no wall-clock limits
@given(st.integers(1, 500), st.integers(0, 8), st.data())
def test_chosen_shards_cover_every_producer(shards, k, data):
    workers = data.draw(st.lists(st.sampled_from("abcde"), min_size=shards, max_size=shards))
    producers = dict(enumerate(workers))
    picks = choose_shards("ab" * 32, shards, producers, k)
    assert len(set(picks)) == len(picks) and all(0 <= s < shards for s in picks)
    if k:
        assert picks[:k] == hash_order("ab" * 32, shards, k)
        assert {producers[s] for s in picks} == set(workers)
    else:
        assert picks == []


def test_the_record_says_where_each_check_ran(two_workers, loop, tmp_path):
    res = mc.run(_job(corruptible), client=two_workers, verify=4, progress=False, shards_per_task=2,
                 store=str(tmp_path))
    v = res.verification
    n = len(v["checked"])
    assert v["checks"] == n >= 4 and v["checks_elsewhere"] == n and v["elsewhere"] == f"{n} of {n}"
    assert all(c["elsewhere"] and c["producer"] != c["verifier"] for c in v["checked"]) and v["moved"] == 0
    import json

    stored = json.loads((tmp_path / "runs" / res.run_id / "result.json").read_text())["verification"]
    assert stored["elsewhere"] == f"{n} of {n}"
    # One worker (the embedded default's shape): every check re-ran where its shard was made, and says so.
    with LocalCluster(loop=loop, n_workers=1, threads_per_worker=2, processes=False,
                      dashboard_address=None) as cl, Client(cl, set_as_default=False) as c:
        one = mc.run(_job(corruptible), client=c, verify=4, progress=False, shards_per_task=2).verification
    m = len(one["checked"])
    assert one["elsewhere"] == f"0 of {m}" and one["checks_elsewhere"] == 0
    assert all(c["same_worker"] and not c["elsewhere"] for c in one["checked"])


@pytest.mark.timeout(300, method="thread")
def test_an_edited_reused_shard_blames_its_stored_file_not_the_worker_named_in_it(two_workers, tmp_path):
    import dask

    job, store = _job(corruptible, 16), str(tmp_path / "store")
    clean = mc.run(job, client=two_workers, verify=0, progress=False, shards_per_task=4, store=store)
    rs = mc.RunStore(store)
    held = rs.read_shards(job.id)
    _, writer, path = held[5]
    # Rewrite shard 5's file with shard 6's state in its place: valid, within every bound, wrong.
    states = {s: held[6][0] if s == 5 else st for s, (st, _, f) in held.items() if f == path}
    pathlib.Path(path).unlink()
    rs.write_shards(job.id, states, writer)
    (tmp_path / "store" / "runs" / job.id / "result.json").unlink()
    with dask.config.set({"research.montecarlo.verify-reused": "all"}):
        again = mc.run(job, client=two_workers, verify=1, progress=False, shards_per_task=4, store=store)
    v = again.verification
    assert [m["shard"] for m in v["mismatches"]] == [5]
    assert v["mismatches"][0]["faulty"] == [f"the stored shard file (producer {writer})"]
    assert v["quarantined_workers"] == [] and len(v["quarantined_files"]) == 1     # the file, not the worker
    assert v["recomputed_shards"] == len(states) and again.state == clean.state
    assert list((tmp_path / "store" / "runs" / job.id / "quarantine").glob("*.json"))
    after = mc.RunStore(store).read_shards(job.id)
    assert sorted(after) == list(range(16)) and after[5][0] == mc.compute_shard(job, 5)
