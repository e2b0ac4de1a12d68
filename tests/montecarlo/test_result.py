"""How a result presents its two kinds of interval: the mean's confidence interval and the output's spread.

A reader who quotes the output's 95 % interval as the uncertainty of the mean is wrong by a
factor of about sqrt(n); the printed result, the summary and the notebook table must name
both, with numbers that agree with ``mean_interval`` and ``interval``.
"""
import json
import math
import re

import numpy as np
import pytest
from distributed import Client, LocalCluster

from dask_research import montecarlo as mc
from dask_research.montecarlo.accumulators import Moments
from dask_research.montecarlo.result import Result

from .conftest import MU, SD, saturating

NUM = r"(-?[0-9.]+(?:e[-+]?\d+)?)"


def _result(n=100_000, mu=10.0, sd=2.0):
    y = np.random.default_rng(0).normal(mu, sd, n)
    return Result("ab" * 32, Moments.from_samples(y, (mu - 10 * sd, mu + 10 * sd), 200), name="demo",
                  shards=4, samples_per_shard=n // 4)


def _line(text, label):
    lines = [ln for ln in text.splitlines() if ln.strip().startswith(label)]
    assert len(lines) == 1, (label, text)
    return lines[0]


def test_print_shows_the_confidence_interval_of_the_mean_and_the_output_interval_labelled():
    r = _result()
    text = str(r)
    lo, hi = r.mean_interval(0.95)
    iv = r.interval(0.95)

    mean_line = _line(text, "mean ")
    m = re.search(rf"mean\s+{NUM} ± {NUM} \(95 % CI of the mean \[{NUM}, {NUM}\]; stderr {NUM}\)", mean_line)
    assert m, mean_line
    mean, half, clo, chi, stderr = map(float, m.groups())
    # printed to two significant digits of the half width: each number within half a last digit
    digits = len(m.group(2).split(".")[1])
    tol = 0.5 * 10 ** -digits + 1e-12
    assert abs(mean - r.mean) <= tol and abs(clo - lo) <= tol and abs(chi - hi) <= tol
    assert abs(half - 1.959964 * r.stderr) <= tol
    assert stderr == pytest.approx(r.stderr, rel=0.05)

    sampled = re.search(rf"output 95 % sampled\s+\[{NUM}, {NUM}\] \(2.5th-97.5th percentiles of the outputs\)",
                        _line(text, "output 95 % sampled"))
    normal = re.search(rf"output 95 % normal\s+\[{NUM}, {NUM}\] \(mean ± 1.96 sd",
                       _line(text, "output 95 % normal"))
    assert sampled and normal, text
    assert [float(x) for x in sampled.groups()] == pytest.approx(iv.percentile, rel=1e-5)
    assert [float(x) for x in normal.groups()] == pytest.approx(iv.normal, rel=1e-5)

    # the two are different things: the output's interval is about sqrt(n) times wider
    ratio = (iv.normal[1] - iv.normal[0]) / (hi - lo)
    assert ratio == pytest.approx(math.sqrt(r.n), rel=1e-9)
    assert hi - lo < 0.05 < iv.normal[1] - iv.normal[0]


def test_digits_follow_the_width_of_the_confidence_interval():
    # a mean far from zero with a tiny stderr: .6g would print both ends of the CI the same
    y = 1000.0 + np.random.default_rng(1).normal(0.0, 1e-3, 40_000)
    r = Result("cd" * 32, Moments.from_samples(y, (999.9, 1000.1), 64))
    m = re.search(rf"CI of the mean \[{NUM}, {NUM}\]", str(r))
    lo, hi = map(float, m.groups())
    assert lo < hi and lo == pytest.approx(r.mean_interval()[0], abs=1e-7)


def test_summary_names_both_intervals():
    r = _result()
    s = r.summary()
    assert s["mean_interval95"] == pytest.approx(list(r.mean_interval(0.95)))
    assert s["output_interval95_percentile"] == pytest.approx(list(r.interval(0.95).percentile))
    assert s["output_interval95_normal"] == pytest.approx(list(r.interval(0.95).normal))
    assert not any(k.startswith("interval95") for k in s), "an unlabelled interval next to the mean"
    json.loads(r.to_json())


def test_notebook_table_labels_both_intervals():
    r = _result()
    html = r._repr_html_()
    rows = dict(re.findall(r"<th[^>]*>([^<]+)</th><td>([^<]+)</td>", html))
    lo, hi = r.mean_interval(0.95)
    m = re.fullmatch(rf"\[{NUM}, {NUM}\]", rows["95 % CI of the mean"])
    assert m and float(m.group(1)) == pytest.approx(lo, abs=1e-3) and float(m.group(2)) == pytest.approx(hi, abs=1e-3)
    assert "output 95 % sampled" in rows and "output 95 % normal" in rows


@pytest.mark.timeout(120, method="thread")
def test_a_real_run_prints_and_stores_both(tmp_path, loop):
    job = mc.Job(saturating, {n: mc.Normal(m, s) for n, m, s in zip("abcdefg", MU, SD)},
                 shards=8, samples_per_shard=4096, seed=2026, bins=64)
    with LocalCluster(loop=loop, n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cl, \
            Client(cl, set_as_default=False) as c:
        r = mc.run(job, client=c, store=str(tmp_path / "runs"), verify=0, progress=False)
    assert "95 % CI of the mean" in str(r) and "output 95 % sampled" in str(r)
    stored = mc.show(r.run_id, str(tmp_path / "runs"))["result"]
    assert stored["mean_interval95"] == pytest.approx(list(r.mean_interval(0.95)))


def test_a_resumed_run_says_its_shards_came_from_the_store_and_where_checks_ran():
    r = _result()
    r.wall_seconds, r.computed_shards, r.reused_shards, r.shards = 0.04, 0, 4, 4
    # a stored shard's producer is a worker of the earlier run (or unknown)
    r.verification = {"checked": [{"shard": s, "producer": p, "verifier": "tcp://w1", "same_worker": False,
                                   "match": True} for s, p in ((0, "?"), (1, "tcp://gone:1"))], "mismatches": []}
    text = str(r)
    assert "all 4 shards reused from the store (resumed), none computed" in _line(text, "wall")
    assert "M samples/s" not in text
    verified = _line(text, "verified")
    assert "2 stored by an earlier run, recomputed on this cluster" in verified
    assert "another worker" not in verified and "re-run, all match" in verified


def test_checks_on_the_producing_worker_are_not_called_another_worker():
    r = _result()
    r.wall_seconds, r.computed_shards, r.workers = 1.0, 4, {"tcp://w1": 4}
    r.verification = {"checked": [{"shard": s, "producer": "tcp://w1", "verifier": "tcp://w1", "same_worker": True,
                                   "match": True} for s in range(4)], "mismatches": []}
    verified = _line(str(r), "verified")
    assert "4 on the same worker that computed them, the only worker that ran this job" in verified
    assert "another worker" not in verified
