"""Recompute stored shards alone and compare them with what the run accepted.

The run id and the manifest are enough: the inputs, seed, partitioning and histogram range come
from the manifest (plain JSON; nothing in the store is executed). The pipeline comes from the
caller, never from the store: ``job=``, a job this process ran, a module this process has
already imported (``__main__`` included; looked up, never imported), or, only with
``trust_origin=True``, an import of what the manifest records. The rebuilt job must have the
same content address, so a pipeline edited since the run is refused.

Examples
--------
>>> from dask_research import montecarlo as mc
>>> report = mc.replay(result.run_id, shard=317, store="runs/")   # doctest: +SKIP
>>> report.match                                                  # doctest: +SKIP
True
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import uuid
from dataclasses import dataclass
from typing import Any

import dask

from ..exceptions import InputError, StoreError
from .distributions import from_spec
from .job import Job
from .run import _JOBS, open_store, remember_job
from .shard import compute_shard
from .verify import TOLERANCE, hash_order, states_match

__all__ = ["replay", "replay_many", "ReplayReport", "load_job", "show"]


@dataclass
class ReplayReport:
    """One shard recomputed alone next to the stored accumulator."""

    run_id: str
    shard: int
    match: bool
    difference: str | None
    stored: Any
    recomputed: Any
    file: str
    tolerance: str = TOLERANCE

    def __str__(self) -> str:
        verdict = "identical" if self.match else f"DIFFERENT: {self.difference}"
        return f"run {self.run_id[:12]} shard {self.shard}: recomputed alone, {verdict} ({self.tolerance})"


def _walk(obj: Any, qualname: str) -> Any:
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _same_file(a: Any, b: Any) -> bool:
    if not isinstance(a, str) or not isinstance(b, str) or a.startswith("<") or b.startswith("<"):
        return False
    try:
        return os.path.realpath(a) == os.path.realpath(b)
    except (OSError, ValueError):
        return False


def _pipelines_in_this_process(origin: dict) -> list:
    """Candidates for the recorded pipeline among modules this process has already imported.

    Nothing is imported or executed: the manifest's module name is looked up in
    ``sys.modules`` (``__main__`` included), then any loaded module whose file is the recorded
    file (the CLI loads ``FILE:JOB`` under a private name). The caller checks the content address.
    """
    module, qualname, path = origin.get("module"), origin.get("qualname"), origin.get("file")
    out: list = []
    mods: list = []
    if isinstance(module, str) and module in sys.modules:
        mods.append(sys.modules[module])
    if isinstance(path, str):
        for m in list(sys.modules.values()):
            if m is not None and m not in mods and _same_file(getattr(m, "__file__", None), path):
                mods.append(m)
    for m in mods:
        obj = _walk(m, qualname)
        if callable(obj) and obj not in out:
            out.append(obj)
    return out


def _import_origin(origin: dict, where: str) -> Any:
    """Import the recorded module or load the recorded file: only on ``trust_origin=True``."""
    module, qualname, path = origin.get("module"), origin.get("qualname"), origin.get("file")
    mod = None
    if isinstance(module, str) and module and module != "__main__" and not module.startswith("_dask_research_"):
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            spec = None
        if spec is not None:
            mod = importlib.import_module(module)
    if mod is None:
        if not isinstance(path, str) or not os.path.isfile(path):
            raise StoreError(where, f"records its pipeline {qualname!r} in module {module!r}, file {path!r}, "
                             "which cannot be imported here; pass job= (CLI: --job FILE:JOB)")
        # Loaded under a private name, so a script's ``if __name__ == "__main__":`` block does not run.
        name = f"_dask_research_replay_{uuid.uuid4().hex[:8]}"
        file_spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(file_spec)
        sys.modules[name] = mod
        file_spec.loader.exec_module(mod)
    obj = _walk(mod, qualname)
    if not callable(obj):
        raise StoreError(where, f"{path or module} has no {qualname!r} any more; pass job=")
    return obj


def _load_pipelines(origin: dict, where: str, trust_origin: bool) -> list:
    """The pipeline candidates for a manifest's origin; never imports unless ``trust_origin``.

    A store may have been written by someone else: it must not choose what code runs here. The
    pipeline comes from the caller's process (a module it has already imported, ``__main__``
    included) or, with ``trust_origin=True``, from importing what the manifest records. Whatever
    is found, the rebuilt job must have the run's content address.
    """
    module, qualname, path = origin.get("module"), origin.get("qualname"), origin.get("file")
    if not isinstance(qualname, str) or not qualname or "<" in qualname:
        raise StoreError(where, f"the pipeline {qualname!r} cannot be found again by name; pass job= "
                         "(CLI: --job FILE:JOB or --job MODULE:JOB)")
    found = _pipelines_in_this_process(origin)
    if found or trust_origin:
        return found
    raise StoreError(where, f"records its pipeline as {qualname!r} in module {module!r}, file {path!r}, which "
                     "this process has not imported; a store never chooses the code that runs: pass job= "
                     "(CLI: --job FILE:JOB or --job MODULE:JOB), or trust_origin=True (CLI: --trust-origin) "
                     "to import it if you trust whoever wrote this store")


def load_job(run_id: str, store: Any, job: Job | None = None,
             trust_origin: bool | None = None) -> tuple[Job, dict]:
    """The run's job and its manifest; the job's content address must be the run id.

    Parameters
    ----------
    run_id : str
        The run's id (its content address).
    store : str or RunStore
        The store the run was written to; it must exist.
    job : Job, optional
        The job, from the caller. Without it, the job is rebuilt from the manifest with the
        pipeline taken from this process: a job this process ran or rebuilt, else a module it
        has already imported (looked up in ``sys.modules`` under the recorded name, or by the
        recorded file, ``__main__`` included). Nothing is imported or executed because a
        manifest says so.
    trust_origin : bool, optional
        ``True``: if this process has not imported the pipeline, import the recorded module or
        load the recorded file (under a private name). Only for stores whose writer you trust.

    Raises
    ------
    StoreError
        No such run, the pipeline is not available here (the message says to pass ``job=``,
        ``--job FILE:JOB`` or ``--trust-origin``), or the job found is not the one that ran.
    """
    rs = open_store(store, must_exist=True)
    if rs is None:
        raise InputError("store", store, "the run store the run was written to", where="replay")
    manifest = rs.read_manifest(run_id)
    where = rs.display(rs.run_dir(run_id) + "/manifest.json")
    if job is None:
        job = _JOBS.get(run_id)
    if job is None:
        job = _rebuild_matching(manifest, run_id, where, bool(trust_origin))
    if job.id != run_id:
        raise StoreError(where, f"the job given or found ({job.id[:12]}) is not the one that ran ({run_id[:12]}): "
                         "its pipeline, inputs or engine changed since")
    remember_job(job)
    return job, manifest


def _rebuild_matching(manifest: dict, run_id: str, where: str, trust_origin: bool) -> Job:
    origin = manifest.get("origin") or {}
    if not isinstance(origin, dict):
        raise StoreError(where, "has an 'origin' entry that is not an object (edited or corrupt)")
    candidates = _load_pipelines(origin, where, trust_origin)
    job = None
    for pipeline in candidates + ([None] if trust_origin else []):
        if pipeline is None:   # trusted, and nothing in this process matched: import what is recorded
            pipeline = _import_origin(origin, where)
        try:
            job = _rebuild(manifest, pipeline)
        except StoreError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
            raise StoreError(where, f"cannot rebuild the job from it ({type(e).__name__}: {e})") from None
        if job.id == run_id:
            return job
    return job  # the caller reports that it is not the one that ran


def _rebuild(manifest: dict, pipeline: Any) -> Job:
    """The job a manifest describes, with ``pipeline``."""
    d = manifest["job"]
    inputs = {}
    for spec in d["inputs"]:
        names = spec["names"]
        inputs[tuple(names) if len(names) > 1 or spec["kind"] == "MultivariateNormal" else names[0]] = from_spec(spec)
    acc, part = d["accumulate"], d["partitioning"]
    rng = acc.get("range")
    margin = rng.get("margin") if isinstance(rng, dict) else None
    with dask.config.set({"research.montecarlo.range-margin": margin} if margin is not None else {}):
        job = Job(pipeline, inputs, shards=part["shards"], samples_per_shard=part["samples_per_shard"],
                  seed=d["seed"], bins=acc.get("bins"), range=None if isinstance(rng, dict) else rng,
                  name=manifest.get("name"))
        job.id  # noqa: B018 - computed under the manifest's margin
    return job


def replay(run_id: str, shard: int, store: Any, job: Job | None = None,
           trust_origin: bool | None = None) -> ReplayReport:
    """Recompute ``shard`` of a stored run alone and compare it with the stored accumulator.

    ``job`` and ``trust_origin`` are as in :func:`load_job`: without ``job``, the pipeline
    comes from this process, never from importing what the store names (unless
    ``trust_origin=True``).
    """
    rs = open_store(store, must_exist=True)
    job, manifest = load_job(run_id, rs, job, trust_origin)
    if not isinstance(shard, int) or not 0 <= shard < job.shards:
        raise InputError("shard", shard, f"an index in [0, {job.shards})", where=f"run {run_id[:12]}")
    stored = rs.read_shards(run_id)
    if shard not in stored:
        raise StoreError(rs.display(rs.run_dir(run_id)), f"has no accepted accumulator for shard {shard} "
                         f"({len(stored)} of {job.shards} stored)")
    state, _, path = stored[shard]
    reducer = job.make_reducer(tuple(manifest["range"]) if manifest.get("range") else None)
    again = compute_shard(job, shard, reducer=reducer)
    diff = states_match(state, again)
    return ReplayReport(run_id, shard, diff is None, diff, state, again, rs.display(path))


def replay_many(run_id: str, store: Any, shards: list[int] | None = None, k: int = 4,
                job: Job | None = None, trust_origin: bool | None = None) -> list[ReplayReport]:
    """Replay the given shards, or ``k`` chosen from the hash of the run id (see :func:`replay`)."""
    rs = open_store(store, must_exist=True)
    job, _ = load_job(run_id, rs, job, trust_origin)
    picks = shards if shards is not None else hash_order(run_id, job.shards, k)
    return [replay(run_id, s, rs, job=job) for s in picks]


def show(run_id: str | None, store: Any) -> dict:
    """What a store holds about a run (or the list of runs when ``run_id`` is None).

    Raises :class:`~dask_research.exceptions.StoreError` if the store does not exist.
    """
    rs = open_store(store, must_exist=True)
    if run_id is None:
        return {"store": repr(rs), "runs": rs.list_runs()}
    matches = [r for r in rs.list_runs() if r.startswith(run_id)]
    if len(matches) != 1:
        raise StoreError(repr(rs), f"{len(matches)} runs start with {run_id!r}; give more characters"
                         if matches else f"has no run starting with {run_id!r}")
    rid = matches[0]
    manifest = rs.read_manifest(rid)
    stored = rs.read_shards(rid)            # decoded: an edited accumulator is refused here too
    try:
        shards = int(manifest["job"]["partitioning"]["shards"])
    except (KeyError, TypeError, ValueError) as e:
        raise StoreError(rs.display(rs.run_dir(rid) + "/manifest.json"), f"has no valid shard count ({e})") from None
    result = rs.read_result(rid)
    if result is not None:
        for k in ("mean", "stderr", "sd", "n"):
            if not isinstance(result.get(k), (int, float, type(None))):
                raise StoreError(rs.display(rs.run_dir(rid) + "/result.json"), f"has a non-numeric {k!r}")
    return {"run_id": rid, "name": manifest.get("name"), "created": manifest.get("created"),
            "shards": shards, "stored_shards": len(stored), "complete": len(stored) == shards,
            "range": manifest.get("range"), "versions": manifest.get("versions"),
            "origin": manifest.get("origin"), "result": result}
