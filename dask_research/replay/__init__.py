"""The experience data plane for reinforcement learning.

Ingest from actors, placement over tiers (GPU, host, disk) by heat and bandwidth, samplers
(uniform, prioritized, most-recent), a samples-per-insert rate limiter, prefetched delivery to
numpy / torch / CuPy with exposed latency recorded, checkpoints without pickle, and a
replay-buffer adapter. torch and CuPy are imported only when a call needs them.

Examples
--------
>>> import numpy as np
>>> from dask_research import replay
>>> plane = replay.ExperiencePlane(
...     {"obs": ((4,), "float32"), "action": ((), "int64"), "reward": ((), "float32"),
...      "next_obs": ((4,), "float32"), "done": ((), "bool")},
...     capacity=10_000, sampler=replay.PrioritizedSampler(alpha=0.6, beta=0.4), seed=0)
>>> n = plane.ingest({"obs": np.zeros((256, 4)), "action": np.zeros(256, "int64"),
...                   "reward": np.ones(256), "next_obs": np.zeros((256, 4)),
...                   "done": np.zeros(256, bool)})
>>> for batch in plane.batches(batch_size=32, prefetch=2, max_batches=2):
...     _ = plane.update_priorities(batch.indices, np.abs(batch.reward) + 0.1)
>>> plane.stats()["delivery"]["batches"]
2
>>> plane.close()
"""
from .adapter import ReplayBufferAdapter
from .batch import Batch
from .experience_plane import EmptyPlaneError, ExperiencePlane, PlaneClosedError
from .local_delivery import BatchIterator, DeliveryStats
from .rate_limiter import RateLimiter
from .samplers import PrioritizedSampler, RecentSampler, Sampler, UniformSampler
from .spec import ExperienceSpec, Field
from .stats_publisher import publish_plane
from .storages import (
                       DeviceStorage,
                       DeviceTier,
                       DiskStorage,
                       DiskTier,
                       HostStorage,
                       HostTier,
                       Storage,
                       Tier,
                       TieredStorage,
)
from .tier_placement import Placement, PlacementReport
from .transforms import Normalize, NStepReturn

__all__ = [
    "ExperienceSpec", "Field", "ExperiencePlane", "EmptyPlaneError", "PlaneClosedError", "Batch",
    "Storage", "HostStorage", "DeviceStorage", "DiskStorage", "TieredStorage",
    "Tier", "HostTier", "DeviceTier", "DiskTier",
    "Placement", "PlacementReport",
    "Sampler", "UniformSampler", "PrioritizedSampler", "RecentSampler",
    "RateLimiter", "BatchIterator", "DeliveryStats", "NStepReturn", "Normalize",
    "ReplayBufferAdapter", "publish_plane",
]

# The plane on a Dask cluster (worker shards, cluster delivery): see replay/cluster/.
from . import cluster  # noqa: E402
from .cluster import ClusterPlane, ShardPlugin, ShardsLostError, local_shard  # noqa: E402

__all__ += ["ClusterPlane", "ShardPlugin", "ShardsLostError", "local_shard", "cluster"]
