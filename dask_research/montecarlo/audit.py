"""Auditing a stored run: rebuild its job, recompute shards alone, show what the store holds.

:func:`replay` recomputes stored shards alone and compares them with what the run accepted.

The run id and the manifest are enough: the inputs, seed, partitioning and histogram range come
from the manifest (plain JSON, checked against its schema; nothing in the store is executed).
The pipeline comes from the caller, never from the store: ``job=``, or the pipeline of a
:class:`Job` this process has built (a script's or a console's own job), or, only with
``trust_origin=True``, an import of what the manifest records. No other function of any module
(``__main__`` included) is ever a candidate, and the rebuilt job must have the same content
address, so a pipeline edited since the run is refused.

Examples
--------
>>> from dask_research import montecarlo as mc
>>> report = mc.replay(result.run_id, shard=317, store="runs/")   # doctest: +SKIP
>>> report.match                                                  # doctest: +SKIP
True
"""
from __future__ import annotations

import bisect
import importlib
import importlib.util
import inspect
import os
import sys
import types
import uuid
from dataclasses import dataclass
from typing import Any

from ..exceptions import InputError, PipelineError, ResearchError, StoreError
from .address import BYTECODE, SCHEME, pipeline_fingerprint, scheme_of
from .distributions import from_spec
from .job import Job
from .job_registry import JOBS, remember_job
from .run import open_store
from .shard_compute import compute_shard
from .store import RunStore
from .store.holdings import stored_state_problem
from .store.layout import MANIFEST_FILE, RESULT_FILE
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
    #: The run's shard count (``None`` if unknown), so a summary can say how many were not re-run.
    of_shards: int | None = None
    #: How many of the run's shards the store holds (``mc verify``: what a sample was drawn from).
    stored_shards: int | None = None
    #: The run's seed (the shard was recomputed with it, whatever the job given says).
    seed: int | None = None

    def __str__(self) -> str:
        verdict = "identical" if self.match else f"DIFFERENT: {self.difference}"
        return f"run {self.run_id[:12]} shard {self.shard}: recomputed alone, {verdict} ({self.tolerance})"


def _walk(obj: Any, qualname: str) -> Any:
    """``module.A.f`` by ``vars()`` only: no ``__getattr__``, no descriptors, no imports.

    Dunder and private parts are refused (``None``); each step must be a module or a class.
    """
    for part in qualname.split("."):
        if not part.isidentifier() or part.startswith("_"):
            return None
        if not isinstance(obj, (types.ModuleType, type)):
            return None
        try:
            obj = inspect.getattr_static(obj, part)
        except AttributeError:
            return None
    return obj


def _built_pipelines(recorded: Any, scheme: int = SCHEME) -> list:
    """The pipelines of jobs built in this process whose description is the recorded one.

    Only a pipeline some :class:`Job` of this process was built on is a candidate (see
    :class:`~dask_research.montecarlo.job_registry.JobRegistry`); a function of ``__main__`` or of any
    module that no job was built on never is, whatever a manifest names. The caller checks
    the content address.
    """
    out = []
    for fn in JOBS.pipelines():
        try:
            if pipeline_fingerprint(fn, scheme=scheme) == recorded:
                out.append(fn)
        except Exception:     # no content address: it cannot be the recorded pipeline
            continue
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
        if file_spec is None or file_spec.loader is None:
            raise StoreError(where, f"records its pipeline in {path!r}, which cannot be loaded as a module; pass job=")
        mod = importlib.util.module_from_spec(file_spec)
        sys.modules[name] = mod
        file_spec.loader.exec_module(mod)
    obj = _walk(mod, str(qualname))
    if not callable(obj):
        raise StoreError(where, f"{path or module} has no {qualname!r} any more; pass job=")
    return obj


class PipelineNotGiven(StoreError):
    """The run's pipeline is not a job's built in this process and ``trust_origin`` is off: the
    caller must give the job (the command line's ``--job``); :attr:`recorded` names what the run
    recorded."""

    def __init__(self, path: str, problem: str, recorded: str = "?"):
        super().__init__(path, problem)
        self.recorded = recorded


def _load_pipelines(manifest: dict, where: str, trust_origin: bool, scheme: int = SCHEME) -> list:
    """The pipeline candidates for a manifest: those of jobs built here; never imports unless ``trust_origin``.

    A store may have been written by someone else: it must not choose what code runs here. The
    pipeline comes from the caller's process (a job it built) or, with ``trust_origin=True``,
    from importing what the manifest records. Whatever is found, the rebuilt job must have
    the run's content address.
    """
    origin = manifest.get("origin") or {}
    found = _built_pipelines(manifest["job"]["pipeline"], scheme)
    if found or trust_origin:
        return found
    raise PipelineNotGiven(where, f"records its pipeline as {_recorded(origin)}, which is not the pipeline of any job "
                     "built in this process, and a store never chooses the code that runs: pass job= the job that "
                     "ran (command line: --job FILE:JOB or MODULE:JOB, naming the Job object in your own copy of "
                     "the code), or --trust-origin (trust_origin=True) to import what it records if you trust "
                     "whoever wrote this store", recorded=_recorded(origin))


def _recorded(origin: dict) -> str:
    """How a manifest names its pipeline: qualname, file and (a public) module."""
    module, qualname, path = origin.get("module"), origin.get("qualname"), origin.get("file")
    where = [f"file {path}"] if isinstance(path, str) and path else []
    if isinstance(module, str) and module and not module.startswith("_dask_research_"):
        where.append(f"module {module}")
    return f"{qualname!r}" + (f" ({', '.join(where)})" if where else "")


def _existing_store(store: Any, where: str) -> RunStore:
    """The store a run was written to, opened; it must exist."""
    rs = open_store(store, must_exist=True)
    if rs is None:
        raise InputError("store", store, "the run store the run was written to", where=where)
    return rs


def load_job(run_id: str, store: Any, job: Job | None = None,
             trust_origin: bool | None = None) -> tuple[Job, dict]:
    """The run's job and its manifest; the job's content address must be the run id (under the
    address scheme the run was written with: a store written before scheme 2 is checked against
    the job's scheme-1 address, :meth:`Job.address`).

    Parameters
    ----------
    run_id : str
        The run's id (its content address).
    store : str or RunStore
        The store the run was written to; it must exist.
    job : Job, optional
        The job, from the caller. Without it: a :class:`Job` this process built with this
        content address, else the job rebuilt from the manifest on the pipeline of a job this
        process built (the same function, with the recorded inputs). No other function is a
        candidate, and nothing is imported or executed because a manifest says so.
    trust_origin : bool, optional
        ``True``: if this process has not imported the pipeline, import the recorded module or
        load the recorded file (under a private name). Only for stores whose writer you trust.

    Raises
    ------
    StoreError
        No such run, the pipeline is not available here (the message says to pass ``job=``,
        ``--job FILE:JOB`` or ``--trust-origin``), or the job found is not the one that ran.
    """
    rs = _existing_store(store, "replay")
    run_id = rs.resolve(run_id)
    manifest = rs.read_manifest(run_id)
    where = rs.display(rs.path(run_id, MANIFEST_FILE))
    scheme = scheme_of(manifest["job"], where)    # 1: a store written before scheme 2, checked as it was
    if job is None:
        job = JOBS.get(run_id, scheme)
    if job is None:
        job = _rebuild_matching(manifest, run_id, where, bool(trust_origin), scheme)
    elif job.address(scheme) != run_id:
        job = _with_recorded_partitioning(job, manifest, run_id, scheme)
    if job.address(scheme) != run_id:
        d: dict = manifest["job"] if isinstance(manifest.get("job"), dict) else {}
        part: dict = d["partitioning"] if isinstance(d.get("partitioning"), dict) else {}
        raise StoreError(where, f"the job given or found ({job.address(scheme)[:12]}) is not the one that ran ({run_id[:12]}): "
                         f"the run recorded pipeline {_recorded(manifest.get('origin') or {})}, "
                         f"{part.get('shards')} shards of {part.get('samples_per_shard')} samples, seed "
                         f"{d.get('seed')}; a different job, or its pipeline, inputs or engine changed since"
                         + _python_changed(d))
    remember_job(job)
    return job, manifest


def _with_recorded_partitioning(job: Job, manifest: dict, run_id: str, scheme: int) -> Job:
    """``job`` with the shard count and seed the run recorded, if that is the run (else ``job``).

    ``mc run --shards N --seed S`` changes the job file's job; the job file given to ``mc
    replay``/``mc verify`` afterwards is the same file without them. The pipeline, inputs and
    everything else must still be the caller's: only these two come from the manifest.
    """
    d = manifest.get("job")
    part = d.get("partitioning") if isinstance(d, dict) else None
    shards, seed = (part or {}).get("shards"), (d or {}).get("seed")
    if not isinstance(shards, int) or not isinstance(seed, int) or (shards, seed) == (job.shards, job.seed):
        return job
    try:
        recorded = job.replace(shards=shards, seed=seed)
    except InputError:
        return job
    return recorded if recorded.address(scheme) == run_id else job


def _python_changed(described: dict) -> str:
    """A clause for a run whose pipeline was described by another Python's bytecode ('' if not)."""
    header = described.get("address")
    ran = header.get("bytecode") if isinstance(header, dict) else None
    if not isinstance(ran, str) or ran == BYTECODE:
        return ""
    return (f" (it was addressed by {ran}'s bytecode, this is {BYTECODE}: a pipeline's address belongs to one "
            "Python minor version; replay it there)")


def _rebuild_matching(manifest: dict, run_id: str, where: str, trust_origin: bool, scheme: int = SCHEME) -> Job:
    origin = manifest.get("origin") or {}
    candidates = _load_pipelines(manifest, where, trust_origin, scheme)
    job: Job | None = None
    for pipeline in candidates + ([None] if trust_origin else []):
        if pipeline is None:   # trusted, and nothing in this process matched: import what is recorded
            pipeline = _import_origin(origin, where)
        try:
            job = _rebuild(manifest, pipeline)
        except StoreError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, InputError) as e:
            raise StoreError(where, f"cannot rebuild the job from it ({type(e).__name__}: {e})") from None
        if job.address(scheme) == run_id:
            return job
    assert job is not None   # _load_pipelines found a candidate, or the origin is trusted (one import)
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
    return Job(pipeline, inputs, shards=part["shards"], samples_per_shard=part["samples_per_shard"],
               seed=d["seed"], bins=acc.get("bins"), range=None if isinstance(rng, dict) else rng,
               name=manifest.get("name"), range_margin=margin)


def replay(run_id: str, shard: int, store: Any, job: Job | None = None,
           trust_origin: bool | None = None) -> ReplayReport:
    """Recompute ``shard`` of a stored run alone and compare it with the stored accumulator.

    ``job`` and ``trust_origin`` are as in :func:`load_job`: without ``job``, the pipeline
    comes from this process, never from importing what the store names (unless
    ``trust_origin=True``).
    """
    rs = _existing_store(store, "replay")
    job, manifest = load_job(run_id, rs, job, trust_origin)
    only = [shard] if isinstance(shard, int) else []      # only the file(s) holding it are read
    return _replay_loaded(rs, job, manifest, rs.read_shards(manifest["run_id"], only=only), shard)


def _replay_loaded(rs: RunStore, job: Job, manifest: dict, stored: dict, shard: int) -> ReplayReport:
    """:func:`replay` of ``shard`` with the job, manifest and stored shards already read."""
    run_id = manifest["run_id"]        # the whole id, if a prefix was given (job.id for a scheme-1 run is not)
    if not isinstance(shard, int) or not 0 <= shard < job.shards:
        raise InputError("shard", shard, f"an index in [0, {job.shards})", where=f"run {run_id[:12]}")
    if shard not in stored:
        raise StoreError(rs.display(rs.run_dir(run_id)), f"has no accepted accumulator for shard {shard} "
                         f"(no shard file of the run holds it; of {job.shards} shards)")
    state, _, path = stored[shard]
    rng = manifest["range"]
    reducer = job.make_reducer((rng[0], rng[1]) if rng is not None else None)
    template = reducer.init() if (rng is not None or job.frozen) else None
    problem = stored_state_problem(job, shard, state, template)
    if problem:
        raise StoreError(rs.display(path), problem)
    try:
        again = compute_shard(job, shard, reducer=reducer)
    except ResearchError:
        raise
    except Exception as e:   # the pipeline's own error: name the shard (and keep the cause)
        raise PipelineError(shard, f"raised {type(e).__name__}: {e} (replayed alone in this process, "
                            f"run {run_id[:12]})") from e
    diff = states_match(state, again)
    return ReplayReport(run_id, shard, diff is None, diff, state, again, rs.display(path), of_shards=job.shards,
                        seed=job.seed)


def replay_many(run_id: str, store: Any, shards: list[int] | None = None, k: int = 4,
                job: Job | None = None, trust_origin: bool | None = None) -> list[ReplayReport]:
    """Replay the given shards, or ``k`` chosen from the hash of the run id (see :func:`replay`).

    The job, its manifest and the stored shard files holding the chosen shards are read once
    for all of them (they were read again for every shard: 0.33 s a shard on a 512-file store);
    files holding none of them are not read.
    """
    rs = _existing_store(store, "replay")
    job, manifest = load_job(run_id, rs, job, trust_origin)
    run = manifest["run_id"]          # the whole id (a scheme-1 run's is not the job's current id)
    ranges = _held_ranges(rs, run)
    picks = shards if shards is not None else _hashed_stored(rs, run, job.shards, k, ranges)
    stored = rs.read_shards(run, only=[s for s in picks if isinstance(s, int)])   # each file holding one, once
    reports = [_replay_loaded(rs, job, manifest, stored, s) for s in picks]
    held = sum(b - a for a, b in ranges)             # what a sample is drawn from (an incomplete run: fewer)
    for r in reports:
        r.stored_shards = held
    return reports


#: Most hashed shard indices :func:`_hashed_stored` looks through for stored ones.
MAX_HASHED_SCAN = 1 << 20


def _held_ranges(rs: RunStore, run: str) -> list[list[int]]:
    """The shards a run's shard files are named for, as disjoint ``[start, stop)`` ranges in order
    (the files' own ranges may overlap; nothing is decoded)."""
    merged: list[list[int]] = []
    for a, b in rs.shard_ranges(run):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return merged


def _hashed_stored(rs: RunStore, run: str, shards: int, k: int, merged: list[list[int]]) -> list[int]:
    """The first ``k`` shards in the run id's hash order that a shard file is named for
    (``merged``: :func:`_held_ranges`).

    A complete run's are :func:`hash_order`'s first ``k``; an incomplete run's (a run to
    resume) skip the shards not stored yet, instead of failing on the first one of them. At
    most :data:`MAX_HASHED_SCAN` indices are looked through; none stored is a :class:`StoreError`.
    """
    starts = [a for a, _ in merged]

    def held(s: int) -> bool:
        i = bisect.bisect_right(starts, s) - 1
        return i >= 0 and s < merged[i][1]

    limit, picks = min(k, shards), []
    while True:
        order = hash_order(run, shards, limit)
        picks = [s for s in order if held(s)][:k]
        if len(picks) >= k or limit >= min(shards, MAX_HASHED_SCAN):
            break
        limit = min(2 * limit, shards, MAX_HASHED_SCAN)
    if not picks:
        raise StoreError(rs.display(rs.run_dir(run)), f"holds no stored shard to verify (of {shards} shards; "
                         "run it again to compute them)")
    return picks


def show(run_id: str | None, store: Any) -> dict:
    """What a store holds about a run (or the list of runs when ``run_id`` is None).

    Every shard is decoded and checked against what the manifest's run produces (the run's
    histogram and sample count): a state that is not is refused, naming its file. The figures
    shown (``n``, mean, sd, stderr, min, max, the intervals, skewness, kurtosis, under- and
    overflow) are recomputed from the stored shards, never taken from ``result.json``; a run
    whose shards cannot give them (incomplete, or a user reducer, whose code show does not
    have) shows none.

    Raises :class:`~dask_research.exceptions.StoreError` if the store does not exist, or a
    file in it is not one the run wrote.
    """
    rs = _existing_store(store, "show")
    if run_id is None:
        runs = rs.list_runs()
        return {"store": rs.display(rs.root), "runs": runs, "summaries": [_summary(rs, rid) for rid in runs]}
    rid = rs.resolve(run_id)
    manifest = rs.read_manifest(rid)         # checked: its schema, the shard count a whole number >= 1
    stored = rs.read_shards(rid)            # decoded: an edited accumulator is refused here too
    rs.check_states(manifest, stored)       # each one what the run's reducer produces
    shards = manifest["job"]["partitioning"]["shards"]
    result = rs.read_result(rid)
    if result is not None:
        moments = "reducer" not in manifest["job"]["accumulate"]
        result = _checked_result(dict(result), stored, shards, rs.display(rs.path(rid, RESULT_FILE)), moments)
    return {"run_id": rid, "name": manifest.get("name"), "created": manifest.get("created"),
            "shards": shards, "stored_shards": len(stored), "complete": len(stored) == shards,
            "range": manifest.get("range"), "versions": manifest.get("versions"),
            "origin": manifest.get("origin"), "result": result}


def _summary(rs: RunStore, rid: str) -> dict:
    """One line's worth of a run for the listing: its manifest's name, creation time and shard
    count, and how many shards its shard files' names hold (nothing decoded: ``show(RUN)``
    checks them); a run whose manifest cannot be read says why instead."""
    try:
        manifest = rs.read_manifest(rid)
        shards = manifest["job"]["partitioning"]["shards"]
        stored = sum(b - a for a, b in _held_ranges(rs, rid))
    except StoreError as e:
        return {"run_id": rid, "problem": e.problem}
    return {"run_id": rid, "name": manifest.get("name"), "created": manifest.get("created"), "shards": shards,
            "stored_shards": stored}


#: Relative difference under which result.json's summary agrees with its shards (merge order
#: changes the last bits: the engine merges per task block, show merges the shards directly).
SUMMARY_RTOL = 1e-9

#: The figures of a run's result: ``show`` recomputes each from the stored shards.
FIGURES = ("n", "mean", "sd", "stderr", "mean_interval95", "skewness", "kurtosis", "min", "max",
           "output_interval95_percentile", "output_interval95_normal", "underflow", "overflow")
#: Figures of ``result.json`` that ``show`` cannot recompute without the pipeline: never shown.
NOT_RECOMPUTED = ("linearized", "state")


def _finite(v: Any) -> Any:
    import math

    if isinstance(v, list):
        return [_finite(x) for x in v]
    return v if not isinstance(v, float) or math.isfinite(v) else None


def _agrees(old: Any, new: Any) -> bool:
    import math

    if isinstance(new, list):
        return isinstance(old, list) and len(old) == len(new) and all(_agrees(a, b) for a, b in zip(old, new))
    if old is None:
        return not (isinstance(new, (int, float)) and math.isfinite(new))
    if not isinstance(old, (int, float)) or isinstance(old, bool):
        return False
    if isinstance(new, int) and isinstance(old, int):
        return old == new
    return math.isclose(float(old), float(new), rel_tol=SUMMARY_RTOL, abs_tol=0.0) or (
        not math.isfinite(float(new)) and not math.isfinite(float(old)))


def _checked_result(result: dict, stored: dict, shards: int, where: str, moments: bool = True) -> dict:
    """``result.json`` checked against the stored shards; its figures recomputed from them.

    ``result.json`` is a convenience copy with no authority: every figure shown (:data:`FIGURES`)
    is recomputed from the stored (checked) accumulators, and those that cannot be
    (:data:`NOT_RECOMPUTED`, or all of them for an incomplete run or a user reducer) are not
    shown. If the file disagrees with the shards, or claims a result the shards cannot give
    (an incomplete run), ``result_mismatch`` says how, its verification record is withheld (it
    cannot be re-checked) and a :class:`~dask_research.montecarlo.store.StoreWarning` is issued.
    """
    import warnings

    from .accumulators import merge_moments
    from .result import Result
    from .store import StoreWarning
    from .tree import tree_fold

    states = [stored[s][0] for s in sorted(stored)]
    problem = None
    for k in NOT_RECOMPUTED:
        result.pop(k, None)
    if len(stored) != shards or not states:
        if result.get("mean") is not None:
            problem = f"claims a result, but only {len(stored)} of {shards} shards are stored"
        for k in FIGURES:
            result[k] = None
    elif moments:
        fresh = Result(result.get("run_id", ""), tree_fold(merge_moments, states)).summary()
        bad = [f"{k} {result[k]!r} (the shards give {fresh[k]!r})" for k in FIGURES
               if k in result and not _agrees(result[k], fresh[k])]
        result.update({k: _finite(fresh[k]) for k in FIGURES})
        result["result_checked"] = True
        if bad:
            problem = "disagrees with the stored shards: " + ", ".join(bad)
    else:
        for k in FIGURES:        # a user reducer's figures: only its own code can recompute them
            result[k] = None
        result["result_checked"] = False
    if problem is not None:
        result["result_mismatch"] = problem
        result["verification"] = None
        warnings.warn(f"{where} {problem}; showing what the shards hold, without its verification record",
                      StoreWarning, stacklevel=3)
    return result
