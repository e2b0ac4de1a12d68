"""Issue 20: blocks in groups, one result message per group; the bits and the fault paths unchanged."""
from __future__ import annotations

import dask
import pytest
from distributed import Client, LocalCluster

from dask_research import montecarlo as mc
from dask_research.exceptions import ConfigError
from dask_research.montecarlo.groups import Groups, chunks, collect_group
from dask_research.testing.processes import wait_for


def _job(shards=64, seed=21, fn=None):
    return mc.Job(fn or (lambda a, b: a * b), {"a": mc.Normal(0, 1), "b": mc.Normal(1, 0.5)}, shards=shards,
                  samples_per_shard=256, seed=seed, bins=32, range=(-5.0, 5.0))


def _result_record(store, job) -> dict:
    rec = mc.RunStore(str(store)).read_result(job.id)
    assert rec is not None
    return rec


@pytest.fixture
def cluster(loop):
    with LocalCluster(loop=loop, n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cl, \
            Client(cl, set_as_default=False) as c:
        yield c


# ------------------------------------------------------------------------------ the parts

class _Fut:
    count = 0

    def __init__(self, status="pending"):
        self.status, self.cancelled = status, False
        _Fut.count += 1
        self.key = f"mc-fake-{_Fut.count}"

    def done(self):
        return self.status in ("finished", "error", "cancelled")

    def cancel(self):
        self.cancelled, self.status = True, "cancelled"


def test_chunks_keep_order_and_size():
    assert chunks(list(range(7)), 3) == [[0, 1, 2], [3, 4, 5], [6]]
    assert chunks([1, 2], 0) == [[1], [2]]          # a size below 1 is 1
    assert collect_group((1, 2)) == [1, 2]


def test_a_group_is_overdue_only_long_after_one_of_its_blocks_finished():
    g = Groups(3)
    collector, members = _Fut(), [_Fut(), _Fut(), _Fut()]
    g.add(collector, members)
    assert g.overdue(0.0, 5.0) == []                 # nothing finished: never overdue
    members[0].status = "finished"
    assert g.overdue(1.0, 5.0) == []                 # the clock starts now
    assert g.overdue(5.5, 5.0) == []
    assert g.overdue(6.5, 5.0) == [collector]
    collector.status = "finished"                    # it answered meanwhile: the next turn takes it
    assert g.overdue(7.0, 5.0) == []
    assert g.open(collector) == members and collector.cancelled and not g and g.opened == 1


# ------------------------------------------------------------------------------ real runs

@pytest.mark.slow
def test_groups_give_the_same_bits_and_one_gather_per_group(cluster, tmp_path):
    job = _job(shards=128)          # 64 blocks: 4 windows of 16, the least a run forms groups for
    states, records, gathers = {}, {}, {}
    real_gather = cluster.gather
    for size in (1, 3, 8):
        calls = []

        def counting(futures, *args, _calls=calls, **kwargs):
            _calls.append(len(futures) if isinstance(futures, list) else 1)
            return real_gather(futures, *args, **kwargs)

        cluster.gather = counting
        store = tmp_path / f"store-{size}"
        try:
            with dask.config.set({"research.montecarlo.group-blocks": size}):
                res = mc.run(job, client=cluster, store=str(store), verify=2, progress=False, shards_per_task=2,
                             speculate=0.0)
        finally:
            del cluster.gather
        states[size], records[size], gathers[size] = res.state, _result_record(store, job)["groups"], calls
        assert sorted(mc.RunStore(str(store)).read_shards(job.id)) == list(range(128))
    assert states[1] == states[3] == states[8]              # same job, same bits, whatever the groups
    assert records[1]["formed"] == 0 and records[3]["size"] == 3 and records[8]["size"] == 8
    assert records[8]["formed"] >= 6 and records[8]["opened"] == 0
    # 64 blocks: one future gathered per block without groups, far fewer with them.
    assert sum(gathers[1]) >= 64 > 2 * sum(gathers[8])


def test_a_small_run_forms_no_groups(cluster, tmp_path):
    store = tmp_path / "store"
    mc.run(_job(shards=32), client=cluster, store=str(store), verify=0, progress=False, shards_per_task=1)
    assert _result_record(store, _job(shards=32))["groups"]["formed"] == 0    # 32 blocks < 4 windows of 16


def test_a_block_failing_inside_a_group_opens_it_and_is_retried_elsewhere(cluster):
    def fails_on_worker_0(a, b):
        from distributed import get_worker

        try:
            name = get_worker().name
        except ValueError:                           # the pilot, on the client
            return a * b
        if name == 0:
            raise RuntimeError("this worker's library is broken")
        return a * b

    job = _job(fn=fails_on_worker_0, seed=22)
    res = mc.run(job, client=cluster, verify=0, progress=False, shards_per_task=1, speculate=0.0, window=8)
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cl, \
            Client(cl, set_as_default=False) as c:
        with dask.config.set({"research.montecarlo.group-blocks": 1}):
            ref = mc.run(_job(seed=22), client=c, verify=0, progress=False, shards_per_task=1)
    assert res.state == ref.state
    assert len(res.workers) == 1 and res.computed_shards == 64


def _sluggish(a, b):
    """Correct everywhere; slow on a worker flagged ``slow``."""
    import time

    from distributed import get_worker

    try:
        if getattr(get_worker(), "slow", False):
            time.sleep(1.5)
    except ValueError:                               # the pilot, on the client
        pass
    return a * b


def test_a_straggler_inside_a_group_is_copied_and_its_group_answers_block_by_block(cluster, tmp_path):
    job = _job(shards=16, seed=23, fn=_sluggish)
    ref = mc.run(job, client=cluster, verify=0, progress=False, shards_per_task=1)
    slow = sorted(cluster.scheduler_info()["workers"])[0]
    cluster.run(lambda dask_worker: setattr(dask_worker, "slow", True), workers=[slow])
    store = tmp_path / "store"
    # a window of 4: groups of 2, formed for runs of 16 blocks or more
    res = mc.run(job, client=cluster, store=str(store), verify=0, progress=False, shards_per_task=1, speculate=3.0,
                 window=4)
    rec = _result_record(store, job)["groups"]
    assert res.state == ref.state
    assert rec["formed"] >= 1 and rec["opened"] >= 1, rec      # a copy won: its group was opened
    assert any(s["speculative_won"] for s in res.speculated), res.speculated
    assert res.workers.get(slow, 0) < 16 // 2, res.workers
    # Each opening is traced once: which shards (a group of two blocks of one shard), and why (a
    # won copy cancels its group's collector; a group late after one of its blocks finished).
    def opened() -> list:
        events = [m for _, m in cluster.get_events("research.montecarlo") if m.get("run") == res.run_id]
        last = max(i for i, m in enumerate(events) if m["event"] == "start")     # the second run's own
        return [m for m in events[last:] if m["event"] == "group-opened"]

    wait_for(lambda: len(opened()) >= rec["opened"], 60, "the run's group-opened events")
    assert len(opened()) == rec["opened"], (opened(), rec)
    assert all(m["stop"] - m["start"] == 2 and m["reason"] in ("cancelled", "late") for m in opened()), opened()


@pytest.mark.parametrize("bad", [0, -2, 2.5, "eight", True])
def test_group_blocks_must_be_a_positive_integer(bad):
    with dask.config.set({"research.montecarlo.group-blocks": bad}):
        # the schema's type check (2.5, "eight", True), or the engine's own range check (0, -2)
        with pytest.raises(ConfigError, match=r"montecarlo.group-blocks=.*(positive number of blocks|"
                                              r"expected an integer \(research-schema.yaml\))") as info:
            mc.run(_job(shards=4), progress=False, verify=0)
    assert "\n" not in str(info.value)
