"""Recompute stored shards alone and compare them with what the run accepted.

The run id, the manifest and the pipeline's source file are enough: the inputs, seed,
partitioning and histogram range come from the manifest (plain JSON; nothing in the store is
executed), the pipeline from the file the run recorded (or ``job=``), and the rebuilt job must
have the same content address, so a pipeline edited since the run is refused.

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
from .run import open_store
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


def _inside_cwd(path: str | None) -> bool:
    if not path:
        return False
    try:
        return os.path.commonpath([os.path.realpath(path), os.path.realpath(os.getcwd())]) == os.path.realpath(os.getcwd())
    except ValueError:
        return False


def _load_pipeline(origin: dict, where: str, trust_origin: bool | None):
    """Import the pipeline the manifest names: only from under the working directory, unless trusted.

    A store may have been written by someone else: it must not choose what code runs here. The
    recorded file is loaded only if it lies under the current working directory (your project)
    or ``trust_origin=True``; in any case the rebuilt job must have the run's content address.
    """
    module, qualname, path = origin.get("module"), origin.get("qualname"), origin.get("file")
    if not isinstance(qualname, str) or not qualname or "<" in qualname:
        raise StoreError(where, f"the pipeline {qualname!r} cannot be found again by name; pass job=")
    source_file = path if isinstance(path, str) else None
    spec = None
    if isinstance(module, str) and module and module != "__main__" and not module.startswith("_dask_research_"):
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.origin:
            source_file = spec.origin
    if trust_origin is False or (trust_origin is None and not _inside_cwd(source_file)):
        raise StoreError(where, f"records its pipeline as {qualname!r} in {source_file!r}, outside the working "
                         "directory; pass job= (CLI: --job MODULE:JOB), or trust_origin=True "
                         "(--trust-origin) if you trust whoever wrote this store")
    if spec is not None:
        mod = importlib.import_module(module)
    else:
        if not source_file or not os.path.exists(source_file):
            raise StoreError(where, f"the pipeline's file {source_file!r} is gone; pass job=")
        name = f"_dask_research_replay_{uuid.uuid4().hex[:8]}"
        file_spec = importlib.util.spec_from_file_location(name, source_file)
        mod = importlib.util.module_from_spec(file_spec)
        sys.modules[name] = mod
        file_spec.loader.exec_module(mod)
    obj: Any = mod
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise StoreError(where, f"{source_file or module} has no {qualname!r} any more; pass job=")
    return obj


def load_job(run_id: str, store: Any, job: Job | None = None,
             trust_origin: bool | None = None) -> tuple[Job, dict]:
    """The run's job (given, or rebuilt from the manifest) and the manifest; ids must agree."""
    rs = open_store(store)
    if rs is None:
        raise InputError("store", store, "the run store the run was written to", where="replay")
    manifest = rs.read_manifest(run_id)
    where = rs.display(rs.run_dir(run_id) + "/manifest.json")
    if job is None:
        try:
            job = _rebuild(manifest, where, trust_origin)
        except StoreError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
            raise StoreError(where, f"cannot rebuild the job from it ({type(e).__name__}: {e})") from None
    if job.id != run_id:
        raise StoreError(where, f"the job given or found ({job.id[:12]}) is not the one that ran ({run_id[:12]}): "
                         "its pipeline, inputs or engine changed since")
    return job, manifest


def _rebuild(manifest: dict, where: str, trust_origin: bool | None) -> Job:
    """The job described by a manifest, with the pipeline from its recorded source file."""
    d = manifest["job"]
    origin = manifest.get("origin") or {}
    if not isinstance(origin, dict):
        raise TypeError("origin is not an object")
    pipeline = _load_pipeline(origin, where, trust_origin)
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

    Without ``job``, the job is rebuilt from the manifest and the pipeline's recorded source
    file, which is loaded only if it lies under the working directory or ``trust_origin=True``.
    """
    rs = open_store(store)
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
    """Replay the given shards, or ``k`` chosen from the hash of the run id."""
    rs = open_store(store)
    job, _ = load_job(run_id, rs, job, trust_origin)
    picks = shards if shards is not None else hash_order(run_id, job.shards, k)
    return [replay(run_id, s, rs, job=job) for s in picks]


def show(run_id: str | None, store: Any) -> dict:
    """What a store holds about a run (or the list of runs when ``run_id`` is None)."""
    rs = open_store(store)
    if run_id is None:
        return {"store": repr(rs), "runs": rs.list_runs()}
    matches = [r for r in rs.list_runs() if r.startswith(run_id)]
    if len(matches) != 1:
        raise StoreError(repr(rs), f"{len(matches)} runs start with {run_id!r}; give more characters"
                         if matches else f"has no run starting with {run_id!r}")
    rid = matches[0]
    manifest = rs.read_manifest(rid)
    stored = rs.read_shards(rid, decoder=lambda doc: None)
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
