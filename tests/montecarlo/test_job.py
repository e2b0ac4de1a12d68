import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from dask_research import montecarlo as mc
from dask_research.exceptions import InputError

from .conftest import MU, SD, saturating


def _job(**kw):
    args = dict(pipeline=saturating, inputs={n: mc.Normal(m, s) for n, m, s in zip("abcdefg", MU, SD)},
                shards=64, samples_per_shard=4096, seed=2026)
    args.update(kw)
    return mc.Job(**args)


SCRIPT = textwrap.dedent("""
    import numpy as np
    from dask_research import montecarlo as mc

    def pipeline(a, b):
        return np.tanh(a) * b + SCALE

    SCALE = 0.5
    job = mc.Job(pipeline, {"a": mc.Normal(1.0, 0.1), "b": mc.LogNormal(0.0, 0.2)},
                 shards=10, samples_per_shard=1000, seed=5)
    print(job.id)
""")


def _id_in_subprocess(tmp_path, source):
    path = tmp_path / "jobdef.py"
    path.write_text(source)
    out = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, check=True)
    return out.stdout.strip()


@pytest.mark.slow
def test_same_job_same_id_across_processes(tmp_path):
    a = _id_in_subprocess(tmp_path, SCRIPT)
    b = _id_in_subprocess(tmp_path, SCRIPT)
    assert a == b and len(a) == 64


@pytest.mark.slow
def test_one_character_changes_give_a_new_id(tmp_path):
    base = _id_in_subprocess(tmp_path, SCRIPT)
    assert _id_in_subprocess(tmp_path, SCRIPT.replace("* b + SCALE", "* b - SCALE")) != base  # body
    assert _id_in_subprocess(tmp_path, SCRIPT.replace("SCALE = 0.5", "SCALE = 0.6")) != base  # constant it uses
    # text outside the pipeline and what it refers to does not change the address
    assert _id_in_subprocess(tmp_path, "# a comment\n" + SCRIPT + "\nOTHER = 1\n") == base


def test_id_changes_with_inputs_seed_partitioning_and_range():
    base = _job()
    assert base.id == _job().id
    changed = [
        _job(seed=2027),
        _job(shards=65),
        _job(samples_per_shard=4097),
        _job(bins=128),
        _job(range=(0.0, 1.5)),
        _job(inputs={**{n: mc.Normal(m, s) for n, m, s in zip("abcdefg", MU, SD)}, "g": mc.Normal(0.0, 1.01)}),
        _job(inputs={n: mc.Normal(m, s) for n, m, s in reversed(list(zip("abcdefg", MU, SD)))}),  # draw order
    ]
    ids = {j.id for j in changed}
    assert base.id not in ids and len(ids) == len(changed)


def test_name_is_not_part_of_the_address():
    assert _job(name="one").id == _job(name="two").id


def test_describe_is_human_readable_and_has_the_engine():
    d = _job().describe()
    assert d["pipeline"]["qualname"] == "saturating" and len(d["pipeline"]["code"]) == 64   # its code's digest
    assert d["address"] == {"scheme": 2, "bytecode": sys.implementation.cache_tag}
    assert "def saturating" in _job().describe(scheme=1)["pipeline"]["source"]    # how old stores described it
    assert d["partitioning"] == {"scheme": "by_seed", "shards": 64, "samples_per_shard": 4096,
                                 "counter": "shard << 64", "pilot_counter": "1 << 128"}
    assert d["engine"]["bit_generator"] == "Philox4x64-10"
    assert d["engine"]["numpy"] == np.__version__


@pytest.mark.parametrize("kw, match", [
    (dict(shards=0), r"shards=0 is invalid; expected a positive integer"),
    (dict(shards=2.5), r"shards=2.5 is invalid"),
    (dict(samples_per_shard=-3), r"samples_per_shard=-3 is invalid"),
    (dict(bins=0), r"bins=0 is invalid"),
    (dict(range=(1.0, 0.0)), r"range=\(1.0, 0.0\) is invalid; expected a pair"),
    (dict(inputs={}), r"inputs=\{\} is invalid"),
    (dict(inputs={"a": 3.0}), r"input 'a': distribution=3.0 is invalid"),
    (dict(pipeline=42), r"pipeline=42 is invalid; expected a callable"),
])
def test_bad_job_arguments(kw, match):
    with pytest.raises(InputError, match=match):
        _job(**kw)


def test_unknown_and_missing_input_names():
    with pytest.raises(InputError, match=r"inputs=\['zeta'\] is invalid; expected names the pipeline accepts"):
        mc.Job(lambda a: a, {"a": mc.Normal(0, 1), "zeta": mc.Normal(0, 1)})
    with pytest.raises(InputError, match=r"missing \['b'\]"):
        mc.Job(lambda a, b: a, {"a": mc.Normal(0, 1)})
    with pytest.raises(InputError, match=r"input name=.a. is invalid; expected names that appear once"):
        mc.Job(lambda a, b: a, {"a": mc.Normal(0, 1), ("a", "b"): mc.MultivariateNormal([0, 0], np.eye(2))})
    # **kwargs pipelines accept any names
    mc.Job(lambda **kw: kw["x"], {"x": mc.Normal(0, 1)})


def test_correlated_block_names_are_drawn_in_declared_order():
    job = mc.Job(lambda a, b, c: a + b + c, {"a": mc.Normal(0, 1), ("b", "c"): mc.MultivariateNormal(
        [0, 0], [[1, 0.5], [0.5, 1]])})
    assert job.names == ("a", "b", "c")


@pytest.mark.parametrize("body", ["math.exp(a)", "1.0 if a > 0 else 0.0"])
def test_a_pipeline_written_for_one_sample_is_told_to_use_arrays(body):
    """The usual first mistake (math.* or if/else on values) gets a pointer, not only numpy's words."""
    import math  # noqa: F401 - used by the pipeline's body

    from dask_research import montecarlo as mc
    from dask_research.exceptions import PipelineError

    scalar_only = eval(f"lambda a: {body}", {"math": math})    # noqa: S307 - a fixed test expression
    job = mc.Job(scalar_only, {"a": mc.Normal(0.0, 1.0)}, shards=2, samples_per_shard=64, seed=1)
    with pytest.raises(PipelineError, match=r"called with one array per input.*np\.exp"):
        mc.pilot(job)


def test_result_repr_is_one_short_line():
    """A bare ``result`` in a console is one line (was a 6 KB dataclass dump); print() is the summary."""
    from dask_research.montecarlo.accumulators import Moments
    from dask_research.montecarlo.result import Result

    y = np.random.default_rng(0).normal(10.0, 2.0, 10_000)
    r = Result("ab" * 32, Moments.from_samples(y, (0.0, 20.0), 64), name="demo", shards=4,
               samples_per_shard=2500, pilot={"range": [0.0, 20.0], "sigma": 2.0, "big": list(range(500))})
    text = repr(r)
    assert "\n" not in text and len(text) < 160
    assert text.startswith("Result(demo, run_id=abababababab") and "95 % CI" in text
    assert f"{r.mean:.6g}" in text and "n=10,000" in text
    assert str(r).count("\n") > 2                        # the summary is unchanged
    user = Result("cd" * 32, {"x": 1.0}, name="u")
    assert repr(user) == "Result(u, run_id=cdcdcdcdcdcd, value={'x': 1.0})"


def test_a_pipeline_typed_into_a_console_gets_the_same_address_in_every_process():
    """Without source text (``python -c``, a console) the pipeline is hashed by its code. Its
    nested code objects (a comprehension, a lambda) went in by ``repr``, which holds a memory
    address, and a set constant's order follows string hashing: two consoles, two addresses, and
    the run could never be resumed or replayed. Two processes with different hash seeds here."""
    code = textwrap.dedent("""
        from dask_research import montecarlo as mc
        def pipe(a, b):
            keep = [k for k in ("x", "y") if k in {"x", "y", "z"}]
            return a * len(keep) + (lambda v: v * 2)(b)
        job = mc.Job(pipe, {"a": mc.Normal(0, 1), "b": mc.Uniform(0, 1)}, shards=4, samples_per_shard=64,
                     seed=3, range=(-10, 10))
        print(job.id)
    """)
    ids = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
        assert out.returncode == 0, out.stderr
        ids.append(out.stdout.strip())
    assert ids[0] == ids[1] and len(ids[0]) == 64, ids
