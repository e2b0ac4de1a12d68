"""TensorDict in and out of the experience plane (needs ``torch`` and ``tensordict`` only).

``from_tensordict`` / ``ingest_tensordict`` turn a ``TensorDict`` (nested keys become
``"outer.inner"`` fields) into a plane batch; ``to_tensordict`` turns a delivered batch into a
``TensorDict`` of batch size ``[B]`` with ``"index"`` (keys, for ``update_priorities``) and the
importance weights of prioritized batches; ``plane.batches(to="tensordict")`` and
:func:`tensordict_batches` deliver prefetched batches as ``TensorDict``. TorchRL's storage and
sampler pair is in :mod:`dask_research.replay.integrations.torchrl`.

Examples
--------
>>> import numpy as np
>>> from dask_research import replay
>>> plane = replay.ExperiencePlane({"obs": ((2,), "float32"), "reward": ((), "float32")},
...                                capacity=16, seed=0)
>>> _ = plane.ingest({"obs": np.ones((8, 2)), "reward": np.arange(8.0)})
>>> with plane.batches(batch_size=4, to="tensordict", max_batches=1) as it:
...     td = next(it)
>>> tuple(td.batch_size), sorted(td.keys())
((4,), ['index', 'obs', 'reward'])
>>> plane.close()
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from ...exceptions import InputError, SpecError
from ..batch import Batch

__all__ = ["from_tensordict", "to_tensordict", "ingest_tensordict", "tensordict_batches",
           "TensorDictBatches", "SEP"]

SEP = "."
#: keys TorchRL's writers and buffers add to a TensorDict; never plane fields
_TORCHRL_KEYS = ("index", "priority_weight", "index_generation")


def from_tensordict(td: Any, drop: tuple[str, ...] = _TORCHRL_KEYS) -> dict[str, np.ndarray]:
    """A plane batch (``{field: ndarray}``) from a ``TensorDict`` (or a mapping of tensors).

    Nested keys become ``"outer.inner"`` fields; keys in ``drop`` (TorchRL's bookkeeping
    entries) are left out. Tensors are moved to the CPU and viewed as numpy (no copy there).
    """
    if isinstance(td, TensorDictBase):
        flat = td.flatten_keys(SEP)
        items = [(k, flat.get(k)) for k in flat.keys()]
    elif isinstance(td, Mapping):
        items = list(td.items())
    else:
        raise SpecError(None, f"expected a TensorDict or a mapping of field -> tensor; got "
                              f"{type(td).__name__}")
    out: dict[str, np.ndarray] = {}
    for k, v in items:
        if k in drop:
            continue
        if isinstance(v, torch.Tensor):
            v = v.detach()
            if v.device.type != "cpu":
                v = v.cpu()
            v = v.numpy()
        out[k] = v
    return out


def ingest_tensordict(plane: Any, td: Any, **kwargs: Any) -> int:
    """``plane.ingest(from_tensordict(td))``: a TensorDict of one or many transitions."""
    return plane.ingest(from_tensordict(td), **kwargs)


def to_tensordict(batch: Batch, device: Any = None, weights_key: str = "priority_weight") -> TensorDict:
    """A ``TensorDict`` of batch size ``[B]`` from a delivered numpy or torch batch.

    Fields named ``"a.b"`` become nested entries ``("a", "b")``; ``"index"`` holds the keys
    (for ``update_priorities``), ``weights_key`` the importance weights of prioritized batches.
    Numpy fields are wrapped without a copy (``torch.from_numpy``) unless ``device`` moves them.
    """
    def tt(a: Any) -> torch.Tensor:
        t = a if isinstance(a, torch.Tensor) else torch.from_numpy(np.asarray(a))
        return t if device is None else t.to(device)

    n = int(batch.size)
    data: dict[str, Any] = {}
    for name, a in batch.items():
        parts = name.split(SEP)
        d = data
        for p in parts[:-1]:
            d = d.setdefault(p, {})
        d[parts[-1]] = tt(a)
    data["index"] = tt(np.asarray(batch.indices, dtype=np.int64))
    if batch.weights is not None:
        data[weights_key] = tt(batch.weights)
    return TensorDict(data, batch_size=[n], device=device)


class TensorDictBatches:
    """``plane.batches(...)`` whose items are ``TensorDict`` (see :func:`tensordict_batches`)."""

    def __init__(self, it: Any, device: Any = None):
        self._it = it
        self.device = device

    def __iter__(self) -> Iterator[TensorDict]:
        return self

    def __next__(self) -> TensorDict:
        return to_tensordict(next(self._it), self.device)

    def close(self) -> None:
        """Stop the plane's delivery pipeline."""
        self._it.close()

    def __enter__(self) -> TensorDictBatches:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def stats(self) -> Any:
        return self._it.stats


def tensordict_batches(plane: Any, device: Any = None, **kwargs: Any) -> TensorDictBatches:
    """Prefetched batches as TensorDicts: ``plane.batches(**kwargs)`` then :func:`to_tensordict`.

    ``device`` (e.g. ``"cuda:0"``) is passed to the plane's delivery (``to="torch"``), so the
    host-to-device copy stays in the prefetch pipeline; the TensorDict wraps the tensors.
    """
    if "to" in kwargs and kwargs["to"] not in ("numpy", "torch"):
        raise InputError("to", kwargs["to"], "'numpy' or 'torch' (the TensorDict wraps them)",
                         where="tensordict_batches")
    if device is not None:
        kwargs.setdefault("to", "torch")
        kwargs["device"] = device
    return TensorDictBatches(plane.batches(**kwargs))
