"""Auditing a stored run: rebuild its job, recompute shards alone, show what the store holds.

:func:`replay` recomputes stored shards alone and compares them with what the run accepted.

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
import inspect
import os
import site
import sys
import sysconfig
import types
import uuid
from dataclasses import dataclass
from typing import Any

from ..exceptions import InputError, PipelineError, ResearchError, StoreError
from .distributions import from_spec
from .job import Job
from .run import _JOBS, open_store, remember_job
from .shard import compute_shard
from .store import RunStore
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


def _is_library_module(mod: types.ModuleType) -> bool:
    """Whether ``mod`` is the standard library, an installed package or built into Python."""
    if mod.__name__ == "__main__":
        return False
    if mod.__name__.split(".")[0] == "dask_research":
        return True     # this package's own functions: public names, never a stored run's pipeline
    path = getattr(mod, "__file__", None)
    if not isinstance(path, str) or mod.__name__ in sys.builtin_module_names:
        return True     # built in, frozen or a namespace package: nothing a user's job is defined in
    real = os.path.realpath(path)
    roots = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    roots.update(site.getsitepackages() if hasattr(site, "getsitepackages") else [])
    if site.ENABLE_USER_SITE and site.getusersitepackages():
        roots.add(site.getusersitepackages())
    return any(real == os.path.realpath(r) or real.startswith(os.path.realpath(r) + os.sep) for r in roots)


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
    file (the CLI loads ``FILE:JOB`` under a private name). Only a *plain function* defined in
    that module under that qualified name qualifies (``type(f) is FunctionType``,
    ``f.__module__`` the module, ``f.__qualname__`` the recorded one), found through ``vars()``
    without ``__getattr__``, and only in a user's module: never the standard library or an
    installed package, whose functions anyone can name. The caller checks the content address.
    """
    module, qualname, path = origin.get("module"), origin.get("qualname"), origin.get("file")
    out: list = []
    mods: list = []
    if not isinstance(qualname, str):
        return out
    if isinstance(module, str) and module in sys.modules:
        mods.append(sys.modules[module])
    if isinstance(path, str):
        for m in list(sys.modules.values()):
            if isinstance(m, types.ModuleType) and m not in mods and _same_file(getattr(m, "__file__", None), path):
                mods.append(m)
    for m in mods:
        if not isinstance(m, types.ModuleType) or _is_library_module(m):
            continue
        obj = _walk(m, qualname)
        if (type(obj) is types.FunctionType and obj.__module__ == m.__name__
                and obj.__qualname__ == qualname and obj not in out):
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
        if file_spec is None or file_spec.loader is None:
            raise StoreError(where, f"records its pipeline in {path!r}, which cannot be loaded as a module; pass job=")
        mod = importlib.util.module_from_spec(file_spec)
        sys.modules[name] = mod
        file_spec.loader.exec_module(mod)
    obj = _walk(mod, str(qualname))
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
    qualname = origin.get("qualname")
    if not isinstance(qualname, str) or not qualname or "<" in qualname:
        raise StoreError(where, f"the pipeline {qualname!r} cannot be found again by name; pass job= "
                         "(CLI: --job FILE:JOB or --job MODULE:JOB)")
    found = _pipelines_in_this_process(origin)
    if found or trust_origin:
        return found
    raise StoreError(where, f"records its pipeline as {_recorded(origin)}, which this process has not imported, "
                     "and a store never chooses the code that runs: pass job= the job that ran (command line: "
                     "--job FILE:JOB or MODULE:JOB, naming the Job object in your own copy of the code), or "
                     "--trust-origin (trust_origin=True) to import what it records if you trust whoever wrote "
                     "this store")


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
    rs = _existing_store(store, "replay")
    run_id = rs.resolve(run_id)
    manifest = rs.read_manifest(run_id)
    where = rs.display(rs.run_dir(run_id) + "/manifest.json")
    if job is None:
        job = _JOBS.get(run_id)
    if job is None:
        job = _rebuild_matching(manifest, run_id, where, bool(trust_origin))
    if job.id != run_id:
        d: dict = manifest["job"] if isinstance(manifest.get("job"), dict) else {}
        part: dict = d["partitioning"] if isinstance(d.get("partitioning"), dict) else {}
        raise StoreError(where, f"the job given or found ({job.id[:12]}) is not the one that ran ({run_id[:12]}): "
                         f"the run recorded pipeline {_recorded(manifest.get('origin') or {})}, "
                         f"{part.get('shards')} shards of {part.get('samples_per_shard')} samples, seed "
                         f"{d.get('seed')}; a different job, or its pipeline, inputs or engine changed since")
    remember_job(job)
    return job, manifest


def _rebuild_matching(manifest: dict, run_id: str, where: str, trust_origin: bool) -> Job:
    origin = manifest.get("origin") or {}
    if not isinstance(origin, dict):
        raise StoreError(where, "has an 'origin' entry that is not an object (edited or corrupt)")
    candidates = _load_pipelines(origin, where, trust_origin)
    job: Job | None = None
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
    run_id = job.id                    # the whole id, if a prefix was given
    if not isinstance(shard, int) or not 0 <= shard < job.shards:
        raise InputError("shard", shard, f"an index in [0, {job.shards})", where=f"run {run_id[:12]}")
    stored = rs.read_shards(run_id)
    if shard not in stored:
        raise StoreError(rs.display(rs.run_dir(run_id)), f"has no accepted accumulator for shard {shard} "
                         f"({len(stored)} of {job.shards} stored)")
    state, _, path = stored[shard]
    reducer = job.make_reducer(tuple(manifest["range"]) if manifest.get("range") else None)
    try:
        again = compute_shard(job, shard, reducer=reducer)
    except ResearchError:
        raise
    except Exception as e:   # the pipeline's own error: name the shard (and keep the cause)
        raise PipelineError(shard, f"raised {type(e).__name__}: {e} (replayed alone in this process, "
                            f"run {run_id[:12]})") from e
    diff = states_match(state, again)
    return ReplayReport(run_id, shard, diff is None, diff, state, again, rs.display(path))


def replay_many(run_id: str, store: Any, shards: list[int] | None = None, k: int = 4,
                job: Job | None = None, trust_origin: bool | None = None) -> list[ReplayReport]:
    """Replay the given shards, or ``k`` chosen from the hash of the run id (see :func:`replay`)."""
    rs = _existing_store(store, "replay")
    job, _ = load_job(run_id, rs, job, trust_origin)
    run_id = job.id
    picks = shards if shards is not None else hash_order(run_id, job.shards, k)
    return [replay(run_id, s, rs, job=job) for s in picks]


def show(run_id: str | None, store: Any) -> dict:
    """What a store holds about a run (or the list of runs when ``run_id`` is None).

    Raises :class:`~dask_research.exceptions.StoreError` if the store does not exist.
    """
    rs = _existing_store(store, "show")
    if run_id is None:
        return {"store": repr(rs), "runs": rs.list_runs()}
    rid = rs.resolve(run_id)
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
        result = _checked_result(dict(result), stored, shards, rs.display(rs.run_dir(rid) + "/result.json"))
    return {"run_id": rid, "name": manifest.get("name"), "created": manifest.get("created"),
            "shards": shards, "stored_shards": len(stored), "complete": len(stored) == shards,
            "range": manifest.get("range"), "versions": manifest.get("versions"),
            "origin": manifest.get("origin"), "result": result}


#: Relative difference under which result.json's summary agrees with its shards (merge order
#: changes the last bits: the engine merges per task block, show merges the shards directly).
SUMMARY_RTOL = 1e-9


def _checked_result(result: dict, stored: dict, shards: int, where: str) -> dict:
    """``result.json`` checked against the stored shards; its summary recomputed from them.

    ``result.json`` is a convenience copy with no authority: ``n``, ``mean``, ``sd``,
    ``stderr``, ``min`` and ``max`` shown are those of the stored (checked) accumulators. If
    the file disagrees with them, or claims a result the shards cannot give (an incomplete
    run), ``result_mismatch`` says how, its verification record is withheld (it cannot be
    re-checked) and a :class:`~dask_research.montecarlo.store.StoreWarning` is issued.
    """
    import math
    import warnings

    from .accumulators import Moments, merge_moments
    from .store import StoreWarning
    from .tree import tree_fold

    states = [stored[s][0] for s in sorted(stored)]
    problem = None
    if len(stored) != shards or not states:
        if result.get("mean") is not None:
            problem = f"claims a result, but only {len(stored)} of {shards} shards are stored"
            for k in ("n", "mean", "sd", "stderr", "min", "max"):
                result[k] = None
    elif all(isinstance(st, Moments) for st in states):
        m = tree_fold(merge_moments, states)
        sd = math.sqrt(m.m2 / (m.n - 1)) if m.n > 1 else math.nan
        fresh = {"n": m.n, "mean": m.mean, "sd": sd, "stderr": sd / math.sqrt(m.n) if m.n else math.nan,
                 "min": m.min, "max": m.max}
        bad = []
        for k, v in fresh.items():
            if k not in result:
                continue      # not claimed by the file (an older or partial summary): nothing to compare
            old = result[k]
            if old is None and not math.isfinite(v):
                continue
            if not isinstance(old, (int, float)) or isinstance(old, bool) or not math.isclose(
                    float(old), float(v), rel_tol=SUMMARY_RTOL, abs_tol=0.0):
                bad.append(f"{k} {old!r} (the shards give {v!r})")
        result.update({k: (v if math.isfinite(v) else None) for k, v in fresh.items()})
        if bad:
            problem = "disagrees with the stored shards: " + ", ".join(bad)
    else:
        result["result_checked"] = False   # a user reducer: its summary is not recomputed here
    if problem is not None:
        result["result_mismatch"] = problem
        result["verification"] = None
        warnings.warn(f"{where} {problem}; showing what the shards hold, without its verification record",
                      StoreWarning, stacklevel=3)
    return result
