"""The worker plugin that gives every Dask worker its own shard of a cluster plane.

:class:`ShardPlugin` is registered by :class:`~dask_research.replay.ClusterPlane` (you rarely
build one yourself). On each worker, present and future, ``setup`` sizes a
:class:`~dask_research.replay.cluster.worker_shard.WorkerShard` from that worker:

- capacity: ``capacity_per_worker`` transitions if given, else ``memory_fraction`` of the
  worker's ``memory_limit`` (of the machine's memory without a limit) divided by the record
  size;
- tiers: one host tier, plus a device tier of ``device_fraction`` of the GPU's memory in front
  of it when the worker sees a CUDA device (CuPy) and ``device_fraction > 0``;
- optional periodic checkpoints of the shard to ``checkpoint_dir`` (a path every worker can
  write, e.g. a shared file system), so a replacement worker can restore a lost shard.

Actors running as tasks find their shard with :func:`local_shard` (no network on ingest).

Examples
--------
>>> from dask_research.replay import PrioritizedSampler
>>> from dask_research.replay.cluster.plugin import ShardPlugin
>>> plugin = ShardPlugin("dqn", {"x": ((4,), "float32")}, capacity_per_worker=100_000,
...                      sampler=PrioritizedSampler(0.6, 0.4))
>>> plugin.name
'research-replay-dqn'
>>> client.register_plugin(plugin)            # doctest: +SKIP
"""
from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from distributed import WorkerPlugin

from ..._compat import worker_memory_limit
from ...exceptions import InputError
from ..samplers import Sampler, UniformSampler
from ..spec import ExperienceSpec
from ..storages import DeviceTier, HostTier, Tier
from .worker_shard import ShardMissingError, WorkerShard

if TYPE_CHECKING:  # pragma: no cover
    from distributed import Worker

logger = logging.getLogger("distributed.worker.research_replay")

PREFIX = "research-replay-"


def plugin_name(plane: str) -> str:
    """Name under which the plugin of plane ``plane`` is registered on workers."""
    return PREFIX + plane


def _machine_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover
        return 4 << 30


def _device_memory() -> int | None:
    """Bytes of the first visible CUDA device, or None (no CuPy, no device)."""
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return None
        return int(cupy.cuda.Device(0).mem_info[1])
    except Exception:
        return None


class ShardPlugin(WorkerPlugin):
    """Give every worker a shard of plane ``plane``.

    To use:

    1. build a ``ClusterPlane(spec, client=client, name=...)``, which registers this plugin with
       ``client.register_plugin``; workers that join later get a shard too;
    2. run actors as tasks that call ``local_shard(name).ingest(...)`` (or
       ``plane.actor_ingest``);
    3. ``client.unregister_worker_plugin(plugin.name)`` (``plane.close(drop=True)``) frees it.

    Parameters
    ----------
    plane : str
    spec : ExperienceSpec or mapping
    capacity_per_worker : int, optional
        Transitions per shard; default from the worker's memory (``memory_fraction``).
    sampler : Sampler
        Default :class:`UniformSampler`; each shard gets its own copy.
    memory_fraction : float
        Share of the worker's memory limit a shard may use when no capacity is given.
    device_fraction : float
        Share of a visible GPU's memory for a device tier in front of the host tier (0: none).
    tiers : callable, optional
        ``tiers(worker, capacity_bytes) -> list[Tier]`` overrides the tier choice.
    seed : int, optional
        Shard ``i`` (in order of setup on that worker) seeds from ``(seed, worker address)``.
    checkpoint_dir : str, optional
        Directory for periodic shard checkpoints (``<dir>/<plane>/<shard uid>/``).
    checkpoint_interval : float, optional
        Seconds between checkpoints of a changed shard; None: only on request.
    """

    idempotent = True

    def __init__(self, plane: str, spec: ExperienceSpec | Mapping[str, Any],
                 capacity_per_worker: int | None = None, sampler: Sampler | None = None,
                 memory_fraction: float = 0.25, device_fraction: float = 0.0,
                 tiers: Callable[[Any, int], list[Tier]] | None = None, seed: int | None = None,
                 checkpoint_dir: str | None = None, checkpoint_interval: float | None = None):
        if not isinstance(plane, str) or not plane:
            raise InputError("name", plane, "a non-empty string", where="ShardPlugin")
        if capacity_per_worker is not None and int(capacity_per_worker) < 1:
            raise InputError("capacity_per_worker", capacity_per_worker,
                             "a positive number of transitions", where="ShardPlugin")
        if not 0 < memory_fraction <= 1:
            raise InputError("memory_fraction", memory_fraction, "a fraction in (0, 1]",
                             where="ShardPlugin")
        if checkpoint_interval is not None and not checkpoint_interval > 0:
            raise InputError("checkpoint_interval", checkpoint_interval,
                             "a positive number of seconds or None", where="ShardPlugin")
        self.plane = plane
        self.name = plugin_name(plane)
        self.spec = spec if isinstance(spec, ExperienceSpec) else ExperienceSpec(spec)
        self.capacity_per_worker = capacity_per_worker
        self.sampler = sampler if sampler is not None else UniformSampler()
        self.memory_fraction = float(memory_fraction)
        self.device_fraction = float(device_fraction)
        self.tiers = tiers
        self.seed = seed
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_interval = checkpoint_interval
        self.shard: WorkerShard | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(shard=None, _stop=None, _thread=None)     # live objects stay on a worker
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._stop = threading.Event()

    # --- sizing --------------------------------------------------------------------------
    def shard_layout(self, worker: Any) -> tuple[int | None, list[Tier] | None]:
        """``(capacity, tiers)`` of the shard on ``worker``."""
        itemsize = self.spec.itemsize
        limit = worker_memory_limit(worker)
        host_bytes = int(self.memory_fraction * (limit or _machine_memory()))
        if self.capacity_per_worker is not None:
            cap = int(self.capacity_per_worker)
            host_bytes = cap * itemsize
        else:
            cap = max(1, host_bytes // itemsize)
        if self.tiers is not None:
            return None, list(self.tiers(worker, cap * itemsize))
        dev = _device_memory() if self.device_fraction > 0 else None
        if dev:
            dev_bytes = min(int(self.device_fraction * dev), cap * itemsize)
            rest = cap * itemsize - dev_bytes
            tiers: list[Tier] = [DeviceTier(dev_bytes, name="device")]
            if rest >= itemsize:
                tiers.append(HostTier(rest, name="host"))
            return cap, tiers
        return cap, None

    # --- hooks ---------------------------------------------------------------------------
    def setup(self, worker: Worker) -> None:
        cap, tiers = self.shard_layout(worker)
        seed = None
        if self.seed is not None:
            import zlib

            seed = [int(self.seed), zlib.crc32(str(worker.address).encode())]
        # a [seed, crc] list seeds numpy's default_rng; WorkerShard's annotation says int only
        self.shard = WorkerShard(self.plane, self.spec, cap if tiers is None else None,
                                 self.sampler, tiers=tiers, seed=seed,  # type: ignore[arg-type]
                                 address=worker.address)
        logger.info("replay plane %r: shard %s with %d transitions on %s", self.plane,
                    self.shard.uid[:8], self.shard.plane.capacity, worker.address)
        if self.checkpoint_dir and self.checkpoint_interval:
            self._thread = threading.Thread(target=self._checkpoint_loop, daemon=True,
                                            name=f"replay-checkpoint-{self.plane}")
            self._thread.start()

    def teardown(self, worker: Worker) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.shard is not None:
            self.shard.close()

    def checkpoint_root(self) -> str:
        return os.path.join(str(self.checkpoint_dir), self.plane)

    def _checkpoint_loop(self) -> None:
        last = -1
        while not self._stop.wait(self.checkpoint_interval):
            shard = self.shard
            if shard is None or shard.plane.total == last:
                continue
            try:
                last = shard.plane.total
                shard.checkpoint(self.checkpoint_root())
            except Exception as e:  # pragma: no cover - keep serving; the next round retries
                logger.warning("replay plane %r: shard checkpoint failed: %s", self.plane, e)


def local_shard(plane: str, worker: Any = None) -> WorkerShard:
    """The shard of ``plane`` on this worker (call inside a task), e.g. in an actor.

    >>> local_shard("dqn").ingest(transitions)      # doctest: +SKIP
    """
    if worker is None:
        from distributed import get_worker

        worker = get_worker()
    plugin = worker.plugins.get(plugin_name(plane))
    if plugin is None or plugin.shard is None:
        raise ShardMissingError(plane, getattr(worker, "address", "?"))
    return plugin.shard


def local_plugin(plane: str, worker: Any = None) -> ShardPlugin:
    """The :class:`ShardPlugin` of ``plane`` on this worker."""
    if worker is None:
        from distributed import get_worker

        worker = get_worker()
    plugin = worker.plugins.get(plugin_name(plane))
    if plugin is None:
        raise ShardMissingError(plane, getattr(worker, "address", "?"))
    return plugin
