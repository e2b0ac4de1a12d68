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


def _load_pipeline(origin: dict, where: str):
    module, qualname, path = origin.get("module"), origin.get("qualname"), origin.get("file")
    if not qualname or "<" in qualname:
        raise StoreError(where, f"the pipeline {qualname!r} cannot be found again by name; pass job=")
    mod = None
    if module and module != "__main__" and not module.startswith("_dask_research_user_"):
        try:
            mod = importlib.import_module(module)
        except ImportError:
            mod = None
    if mod is None:
        if not path or not os.path.exists(path):
            raise StoreError(where, f"the pipeline's file {path!r} is gone; pass job=")
        name = f"_dask_research_replay_{uuid.uuid4().hex[:8]}"
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    obj: Any = mod
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise StoreError(where, f"{path or module} has no {qualname!r} any more; pass job=")
    return obj


def load_job(run_id: str, store: Any, job: Job | None = None) -> tuple[Job, dict]:
    """The run's job (given, or rebuilt from the manifest) and the manifest; ids must agree."""
    rs = open_store(store)
    if rs is None:
        raise InputError("store", store, "the run store the run was written to", where="replay")
    manifest = rs.read_manifest(run_id)
    where = rs.display(rs.run_dir(run_id) + "/manifest.json")
    if job is None:
        d = manifest["job"]
        pipeline = _load_pipeline(manifest.get("origin") or {}, where)
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
    if job.id != run_id:
        raise StoreError(where, f"the job given or found ({job.id[:12]}) is not the one that ran ({run_id[:12]}): "
                         "its pipeline, inputs or engine changed since")
    return job, manifest


def replay(run_id: str, shard: int, store: Any, job: Job | None = None) -> ReplayReport:
    """Recompute ``shard`` of a stored run alone and compare it with the stored accumulator."""
    rs = open_store(store)
    job, manifest = load_job(run_id, rs, job)
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
                job: Job | None = None) -> list[ReplayReport]:
    """Replay the given shards, or ``k`` chosen from the hash of the run id."""
    rs = open_store(store)
    job, _ = load_job(run_id, rs, job)
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
    shards = manifest["job"]["partitioning"]["shards"]
    return {"run_id": rid, "name": manifest.get("name"), "created": manifest.get("created"),
            "shards": shards, "stored_shards": len(stored), "complete": len(stored) == shards,
            "range": manifest.get("range"), "versions": manifest.get("versions"),
            "origin": manifest.get("origin"), "result": rs.read_result(rid)}
