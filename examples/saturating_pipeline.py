"""The main job: a 7-input saturating pipeline, 640 shards x 65,536 draws (42 M samples).

A ratio pushed through a saturating ``tanh`` and a logistic gate: strongly non-linear over
the inputs' spread, so the delta method (printed next to the sampled values) is visibly off.

Run it on an embedded LocalCluster::

    python examples/saturating_pipeline.py

or from the command line, on any cluster::

    dask-research mc run examples/saturating_pipeline.py:job --scheduler tcp://host:8786
"""
import numpy as np

from dask_research import montecarlo as mc


def saturating(a, b, c, d, e, f, g):
    """Vectorised: one array per input in, one array out."""
    t1 = a * b / (c + 1)
    t3 = np.tanh(1.5 * t1)
    return (t3 + 0.1 * np.log1p(np.abs(d)) * e) / (1 + np.exp(-f)) + 0.01 * g


job = mc.Job(
    saturating,
    inputs={
        "a": mc.Normal(1.0, 0.1),
        "b": mc.Normal(2.0, 0.3),
        "c": mc.Normal(0.5, 0.05),
        "d": mc.Normal(3.0, 0.4),
        "e": mc.Normal(0.8, 0.1),
        "f": mc.Normal(0.2, 0.3),
        "g": mc.Normal(0.0, 1.0),
    },
    shards=640,
    samples_per_shard=65_536,
    seed=2026,
    bins=256,
    name="saturating",
)


def main() -> mc.Result:
    pilot = mc.pilot(job)
    print(f"job {job.id[:12]}: {job.total_samples:,} samples in {job.shards} shards")
    print(f"pilot: sigma {pilot.sigma:.4g}, histogram range {pilot.range}, "
          f"{pilot.shard_seconds * 1e3:.1f} ms per shard")
    print("plan:", pilot.plan(target_stderr=1e-5))
    result = mc.run(job, pilot=pilot)           # embedded LocalCluster, progress bar
    print(result)
    return result


if __name__ == "__main__":
    main()
