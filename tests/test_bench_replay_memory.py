"""The replay memory benchmark measures what it says: each buffer holds the ``n`` transitions its
bytes per transition are divided by (issue 29's figure). SB3's ``ReplayBuffer`` divides
``buffer_size`` by ``n_envs`` itself, so the probe's ``ReplayBuffer(n // n_envs, n_envs=...)``
kept 100 of 10,000 transitions (1,000 of 10^6): the table compared ours with SB3's fixed costs
(2,581 and 307 bytes "per transition" where SB3 needs about 52). No time is measured here.
"""
import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_replay", ROOT / "benchmarks" / "bench_replay.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(300, method="thread")
@pytest.mark.parametrize("kind, needs", [("ours", None), ("ours-tiered", None),
                                         ("sb3", "stable_baselines3"), ("torchrl", "torchrl")])
def test_each_buffer_of_the_memory_probe_holds_n_transitions(kind, needs, tmp_path):
    if needs:
        pytest.importorskip(needs)
    probe = _bench().MEMORY_PROBE
    n = 10_000
    out = subprocess.run([sys.executable, "-c", probe, kind, str(n)], capture_output=True, text=True, timeout=240,
                         cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 0, out.stderr[-2000:]
    stored, rss = map(int, out.stdout.split()[-2:])
    assert stored == n, f"{kind} kept {stored:,} of the {n:,} transitions its bytes are divided by"
    assert rss > 0
