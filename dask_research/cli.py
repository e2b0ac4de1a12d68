"""The ``dask-research`` command line (click, like Dask's own CLI).

Examples
--------
.. code-block:: bash

    dask-research --version
    dask-research mc pilot examples/saturating_pipeline.py:job --target-stderr 1e-5
    dask-research mc run examples/saturating_pipeline.py:job
    dask-research mc run examples/saturating_pipeline.py:job --scheduler tcp://10.0.0.5:8786
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import uuid
from typing import Any

import click

from ._version import __version__


def load_object(ref: str) -> Any:
    """Load ``MODULE:NAME`` where MODULE is a dotted module name or a path to a ``.py`` file.

    A file is loaded under a private module name and registered with cloudpickle to be
    pickled by value, so worker processes that cannot import it still get the pipeline.
    """
    if ":" not in ref:
        raise click.BadParameter(f"{ref!r} is not MODULE:NAME (e.g. examples/saturating_pipeline.py:job)")
    mod_ref, _, name = ref.rpartition(":")
    if mod_ref.endswith(".py") or os.sep in mod_ref:
        if not os.path.exists(mod_ref):
            raise click.BadParameter(f"file {mod_ref!r} does not exist")
        mod_name = f"_dask_research_user_{uuid.uuid4().hex[:8]}"
        spec = importlib.util.spec_from_file_location(mod_name, mod_ref)
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        spec.loader.exec_module(module)
        import cloudpickle

        cloudpickle.register_pickle_by_value(module)
    else:
        try:
            module = importlib.import_module(mod_ref)
        except ImportError as e:
            raise click.BadParameter(f"cannot import module {mod_ref!r}: {e}") from None
    try:
        obj = getattr(module, name)
    except AttributeError:
        public = sorted(k for k in vars(module) if not k.startswith("_"))
        raise click.BadParameter(f"{mod_ref!r} has no attribute {name!r}; it has {public}") from None
    return obj


def _load_job(ref: str):
    from .montecarlo import Job

    obj = load_object(ref)
    if callable(obj) and not isinstance(obj, Job):
        obj = obj()
    if not isinstance(obj, Job):
        raise click.BadParameter(f"{ref} is a {type(obj).__name__}, not a dask_research.montecarlo.Job "
                                 "(or a function returning one)")
    return obj


def _client(scheduler: str | None):
    import contextlib

    if scheduler is None:
        return contextlib.nullcontext(None)
    from distributed import Client

    return Client(scheduler)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="dask-research")
def main() -> None:
    """Research workflows on Dask: Monte-Carlo, experiment scheduling, experience replay."""


@main.group()
def mc() -> None:
    """Sharded, verified, replayable Monte-Carlo."""


_job_arg = click.argument("job_ref", metavar="MODULE:JOB")


def _job_options(f):
    f = click.option("--shards", type=click.IntRange(min=1), help="Override the job's shard count.")(f)
    f = click.option("--seed", type=click.IntRange(min=0), help="Override the job's root seed.")(f)
    return f


def _apply_overrides(job, shards, seed):
    changes = {k: v for k, v in (("shards", shards), ("seed", seed)) if v is not None}
    return job.replace(**changes) if changes else job


@mc.command("run")
@_job_arg
@_job_options
@click.option("--scheduler", metavar="ADDRESS", help="A running scheduler; default: an embedded LocalCluster.")
@click.option("--store", metavar="URL", help="Run store (path or fsspec URL): persist shards, resume, replay.")
@click.option("--verify", type=click.IntRange(min=0), help="Shards re-checked on another worker (default from config).")
@click.option("--shards-per-task", type=int, help="A power of two; default from pilot timing.")
@click.option("--progress/--no-progress", default=None, help="Show a progress bar (default from config).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def mc_run(job_ref, shards, seed, scheduler, store, verify, shards_per_task, progress, as_json):
    """Run the Job object JOB defined in MODULE (a file path or module name)."""
    from . import montecarlo
    from .exceptions import ResearchError

    job = _apply_overrides(_load_job(job_ref), shards, seed)
    try:
        with _client(scheduler) as client:
            result = montecarlo.run(job, client=client, store=store, verify=verify,
                                    shards_per_task=shards_per_task, progress=progress)
    except ResearchError as e:
        raise click.ClickException(str(e)) from None
    click.echo(result.to_json() if as_json else str(result))
    if store and not as_json:
        click.echo(f"  stored       runs/{result.run_id} in {_redact(store)}")


def _redact(url: str) -> str:
    from .montecarlo.store import redact

    return redact(url)


_store_opt = click.option("--store", metavar="URL", required=True, help="The run store (path or fsspec URL).")
_job_opt = click.option("--job", "job_ref", metavar="MODULE:JOB",
                        help="The job, if the pipeline cannot be found from the manifest.")
_trust_opt = click.option("--trust-origin", is_flag=True,
                          help="Load the pipeline file the manifest names even outside this directory.")


def _research_errors(fn):
    import functools

    from .exceptions import ResearchError

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ResearchError as e:
            raise click.ClickException(str(e)) from None

    return wrapper


@mc.command("replay")
@click.argument("run_id", metavar="RUN")
@click.option("--shard", type=click.IntRange(min=0), required=True, help="The shard to recompute alone.")
@_store_opt
@_job_opt
@_trust_opt
@_research_errors
def mc_replay(run_id, shard, store, job_ref, trust_origin):
    """Recompute one shard of RUN alone and compare it with the stored accumulator."""
    from . import montecarlo

    run_id = montecarlo.show(run_id, store)["run_id"]
    job = _load_job(job_ref) if job_ref else None
    report = montecarlo.replay(run_id, shard, store, job=job, trust_origin=trust_origin or None)
    click.echo(str(report))
    if not report.match:
        raise SystemExit(1)


@mc.command("verify")
@click.argument("run_id", metavar="RUN")
@click.option("-k", "k", type=click.IntRange(min=1), default=4, show_default=True,
              help="Shards chosen from the hash of the run id.")
@click.option("--shards", help="Comma-separated shard indices instead of -k.")
@_store_opt
@_job_opt
@_trust_opt
@_research_errors
def mc_verify(run_id, k, shards, store, job_ref, trust_origin):
    """Recompute several shards of RUN locally and compare them with the store."""
    from . import montecarlo

    run_id = montecarlo.show(run_id, store)["run_id"]
    try:
        picks = [int(x) for x in shards.split(",")] if shards else None
    except ValueError:
        raise click.BadParameter(f"{shards!r} is not a comma-separated list of integers", param_hint="--shards")
    job = _load_job(job_ref) if job_ref else None
    reports = montecarlo.replay_many(run_id, store, shards=picks, k=k, job=job,
                                     trust_origin=trust_origin or None)
    for r in reports:
        click.echo(str(r))
    bad = [r for r in reports if not r.match]
    click.echo(f"{len(reports) - len(bad)} of {len(reports)} shards reproduced exactly")
    if bad:
        raise SystemExit(1)


@mc.command("show")
@click.argument("run_id", metavar="[RUN]", required=False)
@_store_opt
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@_research_errors
def mc_show(run_id, store, as_json):
    """List the runs in a store, or show one run (a prefix of its id is enough)."""
    import json

    from . import montecarlo

    info = montecarlo.show(run_id, store)
    if as_json:
        click.echo(json.dumps(info, indent=2, default=str))
        return
    if run_id is None:
        click.echo(f"{len(info['runs'])} runs in {_redact(store)}")
        for r in info["runs"]:
            click.echo(f"  {r}")
        return
    click.echo(f"run {info['run_id']} ({info['name']}), created {info['created']}")
    click.echo(f"  shards stored {info['stored_shards']} of {info['shards']}"
               f"{'' if info['complete'] else ' (incomplete: run it again to resume)'}")
    res = info["result"]
    if res and res.get("mean") is not None:
        click.echo(f"  mean {res['mean']:.6g} +- {res['stderr']:.3g}, sd {res['sd']:.6g}, n {res['n']:,}")
        v = res.get("verification") or {}
        if v:
            click.echo(f"  verified {len(v.get('checked', []))} shards on other workers; "
                       f"quarantined {v.get('quarantined_workers') or 'none'}")


@mc.command("pilot")
@_job_arg
@_job_options
@click.option("--target-stderr", type=float, help="Plan the shards needed for this standard error.")
@click.option("--scheduler", metavar="ADDRESS", help="Plan for this cluster's threads.")
def mc_pilot(job_ref, shards, seed, target_stderr, scheduler):
    """Run the pilot shard of JOB: spread, histogram range, time per shard, and a plan."""
    from . import montecarlo
    from .exceptions import ResearchError

    job = _apply_overrides(_load_job(job_ref), shards, seed)
    try:
        p = montecarlo.pilot(job)
    except ResearchError as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"job {job.id}")
    click.echo(f"pilot: mean {p.mean:.6g}, sigma {p.sigma:.6g}, range {p.range}, "
               f"{p.shard_seconds * 1e3:.2f} ms per shard of {job.samples_per_shard:,}")
    if target_stderr is not None:
        with _client(scheduler) as client:
            click.echo(str(p.plan(target_stderr, client=client)))


@main.command("demo")
@click.option("--out", default="dask-research-report.html", show_default=True, help="Where to write the HTML report.")
@click.option("--quick", is_flag=True, help="A smaller run (about 15 s).")
@click.option("--scheduler", metavar="ADDRESS", help="Run on this cluster instead of an embedded one.")
def demo(out, quick, scheduler):
    """Run all three capabilities on an embedded cluster and write an HTML report."""
    from .demo import run_demo

    try:
        import bokeh  # noqa: F401
    except ImportError:
        raise click.ClickException("the demo's report needs bokeh: pip install 'dask-research[dashboard]'") from None
    with _client(scheduler) as client:
        run_demo(out=out, quick=quick, client=client)


def _add_worker_command() -> None:
    from .montecarlo.power import worker_command

    main.add_command(worker_command, name="worker")


_add_worker_command()

if __name__ == "__main__":  # pragma: no cover
    main()
