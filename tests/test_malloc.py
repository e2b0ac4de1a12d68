"""glibc malloc tuning: what it reads, that it removes the page faults, the worker plugin."""
import os
import subprocess
import sys
import textwrap

import dask
import pytest
from distributed.utils_test import gen_cluster

from dask_research.exceptions import ConfigError
from dask_research.malloc import (
    MallocTuning,
    _libc,
    malloc_settings,
    process_worker_environ,
)

glibc = pytest.mark.skipif(_libc() is None, reason="needs glibc (mallopt)")


def test_settings_come_from_config_and_null_leaves_a_key_alone():
    assert malloc_settings() == {"malloc-mmap-threshold": 32 * 2**20,
                                 "malloc-trim-threshold": 64 * 2**20}
    assert malloc_settings("1MiB", 4096) == {"malloc-mmap-threshold": 2**20,
                                             "malloc-trim-threshold": 4096}
    with dask.config.set({"research.cluster.malloc-trim-threshold": None}):
        assert malloc_settings() == {"malloc-mmap-threshold": 32 * 2**20}
        assert list(process_worker_environ()) == [
            "distributed.nanny.pre-spawn-environ.MALLOC_MMAP_THRESHOLD_"]
    with dask.config.set({"research.cluster.malloc-mmap-threshold": "lots"}):
        with pytest.raises(ConfigError, match=r"research.cluster.malloc-mmap-threshold='lots' is "
                                                r"invalid; expected a positive size"):
            malloc_settings()
    with pytest.raises(ConfigError, match=r"malloc-trim-threshold=-5 is invalid"):
        malloc_settings(trim_threshold=-5)


_FAULTS = textwrap.dedent("""
    import resource, threading
    import numpy as np
    from dask_research.malloc import tune_malloc

    def shard(rng):                  # a Monte-Carlo shard's allocations: draws + temporaries
        x = [rng.standard_normal(65536) for _ in range(7)]
        t = np.tanh(1.5 * x[0] * x[1] / (x[2] + 1))
        return float(((t + 0.1 * np.log1p(np.abs(x[3])) * x[4]) / (1 + np.exp(-x[5]))
                      + 0.01 * x[6]).sum())

    def faults_per_shard(n_threads, rounds=30):     # worker threads, page faults per shard
        out = []
        def work(seed):
            rng = np.random.default_rng(seed)
            for _ in range(5):
                shard(rng)
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            for _ in range(rounds):
                shard(rng)
            out.append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / rounds)
        threads = [threading.Thread(target=work, args=(k,)) for k in range(n_threads)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        return sum(out)

    before = faults_per_shard(1)
    assert tune_malloc() is True
    print(before, faults_per_shard(1), faults_per_shard(2))
""")


@pytest.mark.slow
@glibc
def test_tuning_removes_the_page_faults_of_freed_numpy_temporaries():
    # a fresh process, so glibc starts from its defaults (without MALLOC_* variables that a
    # nanny spawned earlier in this test session may have left in os.environ)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", _FAULTS], capture_output=True, text=True,
                         timeout=120, check=True, env=env).stdout.split()
    before, after, after_two = map(float, out)
    # untuned, the freed temporaries go back to the kernel and fault in again on the next
    # shard (1,376 faults per shard, every time); tuned, none, on one worker thread or two.
    # Untuned is measured on one thread: on two, how glibc shares its arenas between them
    # depends on how they interleave, and on a busy machine it measured 320 once in six
    # (1,500-4,700 the other times), failing this bound for a reason that is not the tuning's.
    assert before > 500, (before, after, after_two)
    assert after < before / 50, (before, after, after_two)
    assert after_two < before / 50, (before, after, after_two)


@glibc
@gen_cluster(client=True)
async def test_the_worker_plugin_tunes_every_worker(c, s, a, b):
    await c.register_plugin(MallocTuning("16MiB", "48MiB"))
    events = [msg for _, msg in s.get_events("research.cluster")]
    assert len(events) == 2
    assert all(e["applied"] is True and e["malloc-trim-threshold"] == 48 * 2**20
               for e in events)
    assert all(e["source"] == "cluster" and e["event"] == "malloc-tuning" and e["v"] == 1
               for e in events)                          # the shared envelope (dask_research.events)
