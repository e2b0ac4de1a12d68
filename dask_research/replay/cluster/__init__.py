"""The experience plane on a Dask cluster: one shard per worker, cluster-wide delivery.

See :class:`ClusterPlane` (the learner's handle) with its collaborators :class:`ShardTable`
(the shards as the learner knows them) and :class:`PriorityRouter` (priority updates to the
owning shards), :class:`ShardPlugin` (the worker plugin), :func:`local_shard` (what actors
ingest into) and ``docs/replay-cluster.rst``.

Examples
--------
>>> from dask_research.replay.cluster import plan_moves
>>> plan_moves({0: (100, 100), 1: (0, 100)}, max_move=10)
[(0, 1, 10)]
"""
from . import shard_ops
from .cluster_delivery import ClusterBatchIterator, prefetch_depth
from .cluster_plane import ClusterPlane
from .indices import decode, encode
from .plugin import ShardPlugin, local_shard, plugin_name
from .router import PriorityRouter
from .shard_moves import plan_moves
from .table import ShardRef, ShardTable
from .worker_shard import ShardMissingError, ShardsLostError, WorkerShard

__all__ = ["ClusterPlane", "ShardRef", "ShardTable", "PriorityRouter", "ShardPlugin",
           "WorkerShard", "ShardMissingError", "ShardsLostError",
           "ClusterBatchIterator", "local_shard", "plugin_name", "plan_moves", "prefetch_depth",
           "encode", "decode", "shard_ops"]
