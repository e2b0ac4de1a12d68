"""Monte-Carlo shards on GPU workers (CuPy), with a CPU re-run of the same algorithm.

* :mod:`.philox_ref` - Philox4x64-10 in exact NumPy integer arithmetic (checked against
  ``numpy.random.Philox`` and the Random123 known answers);
* :mod:`.kernel` - the CUDA kernel generated from the reference's constants;
* :mod:`.draws` - portable inputs from the raw stream (53-bit uniforms, Box-Muller);
* :mod:`.compute` - a block of shards in one launch, one state per shard;
* :mod:`.tolerance` - the declared class (:data:`GPU_TOLERANCE`) and :func:`compare`;
* :mod:`.device_choice` - ``Job(device=...)``, Dask resources and the array namespace.

Nothing here imports CuPy until a GPU is actually used.

>>> from dask_research.montecarlo import gpu
>>> gpu.DEVICES, gpu.GPU_RESOURCE
(('cpu', 'gpu', 'any'), 'GPU')
"""
from .compute import block_function, compute_block_portable, compute_shard_portable, recompute_shard, row_moments
from .device_choice import DEVICES, GPU_RESOURCE, is_portable, select_xp, submit_kwargs
from .draws import ALGORITHM, check_portable, draw_rows, namespace
from .tolerance import GPU_RTOL, GPU_TOLERANCE, compare, states_match, tolerance_of

__all__ = [
    "ALGORITHM", "DEVICES", "GPU_RESOURCE", "GPU_RTOL", "GPU_TOLERANCE", "block_function",
    "check_portable", "compare", "compute_block_portable", "compute_shard_portable", "draw_rows",
    "is_portable", "namespace", "recompute_shard", "row_moments", "select_xp", "states_match",
    "submit_kwargs", "tolerance_of",
]
