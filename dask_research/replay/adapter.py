"""A replay-buffer adapter with the interface RL frameworks expect.

:class:`ReplayBufferAdapter` wraps an :class:`ExperiencePlane` behind ``add``, ``extend``,
``sample``, ``update_priority``, ``__len__``, ``get_state`` / ``set_state`` (and the PyTorch
spellings ``state_dict`` / ``load_state_dict``), so a training loop written against a replay
buffer runs on the plane without changes. States are plain dicts of JSON-able values and numpy
arrays (no pickle needed to save them).

A ``TensorDict`` is accepted wherever a dict of arrays is (nested keys become ``"a.b"`` fields,
see :mod:`dask_research.replay.integrations.tensordict`). ``extend`` of more transitions than the
plane holds keeps the newest ``capacity`` of them, as SB3's and TorchRL's buffers do
(``overflow="newest"``, the default here); ``overflow="raise"`` refuses such a batch like
``ExperiencePlane.ingest``. For Stable-Baselines3 use
:class:`~dask_research.replay.integrations.sb3.SB3ReplayBuffer` instead.

Examples
--------
>>> import numpy as np
>>> from dask_research import replay
>>> rb = replay.ReplayBufferAdapter(replay.ExperiencePlane({"x": ((), "float32")}, capacity=8,
...                                                        seed=0), batch_size=4)
>>> rb.add({"x": 1.0}); rb.extend({"x": np.arange(3.0)})
>>> len(rb), rb.sample().x.shape
(4, (4,))
>>> state = rb.get_state()
>>> rb2 = replay.ReplayBufferAdapter(replay.ExperiencePlane({"x": ((), "float32")}, capacity=8))
>>> rb2.set_state(state); len(rb2)
4
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..exceptions import InputError
from .batch import Batch
from .experience_plane import ExperiencePlane
from .local_delivery import make_converter, whole_number


def _as_fields(transitions: Any) -> Any:
    """A TensorDict becomes a plain dict of arrays (lazily: no tensordict import otherwise)."""
    if (type(transitions).__module__ or "").startswith("tensordict"):
        from .integrations.tensordict import from_tensordict

        return from_tensordict(transitions)
    return transitions


class ReplayBufferAdapter:
    """Replay-buffer interface over an :class:`ExperiencePlane`.

    Parameters
    ----------
    plane : ExperiencePlane
    batch_size : int, optional
        Default for :meth:`sample` (else ``research.replay.batch-size``).
    to : {"numpy", "torch", "cupy"}
        Array type of sampled batches.
    device : str, optional
        Device for ``torch``/``cupy`` batches.
    overflow : {"newest", "raise"}
        What :meth:`extend` does with more transitions than the plane holds: keep the newest
        ``capacity`` of them (the peers' behaviour), or raise ``CapacityError``.
    """

    def __init__(self, plane: ExperiencePlane, batch_size: int | None = None,
                 to: str = "numpy", device: Any = None, overflow: str = "newest"):
        if overflow not in ("newest", "raise"):
            raise InputError("overflow", overflow, "'newest' or 'raise'", where="ReplayBufferAdapter")
        if not hasattr(plane, "spec") or not callable(getattr(plane, "ingest", None)):
            raise InputError("plane", plane, "an ExperiencePlane or a ClusterPlane", where="ReplayBufferAdapter")
        if batch_size is not None:
            batch_size = whole_number("batch_size", batch_size, 1, "None or a positive integer",
                                      where="ReplayBufferAdapter")
        self.overflow = overflow
        self.plane = plane
        self.batch_size = batch_size
        self._convert = make_converter(plane.spec, to, device, 2, batch_size or 1)
        self._to = to

    def add(self, transition: Mapping[str, Any]) -> None:
        """Add one transition (or a batch: the spec decides from the shapes)."""
        self.extend(transition)

    def extend(self, transitions: Mapping[str, Any]) -> None:
        """Add a batch of transitions (dict of arrays with a leading batch axis, or a TensorDict).

        Over capacity, ``overflow="newest"`` keeps the newest ``capacity`` transitions.
        """
        transitions = _as_fields(transitions)
        if getattr(self.plane, "capacity", None) is None:      # a ClusterPlane: its shards decide
            self.plane.ingest(transitions)
            return
        self.plane.ingest(transitions, overflow="keep-newest" if self.overflow == "newest" else "raise")

    def sample(self, batch_size: int | None = None) -> Batch:
        """A batch with ``indices`` (keys) and ``weights`` (prioritized samplers)."""
        b = self.plane.sample(batch_size if batch_size is not None else self.batch_size)
        if self._to == "numpy":
            return b
        out = self._convert(None, b)
        self._convert.ready(out)
        return out

    def update_priority(self, indices: Any, priorities: Any) -> int:
        """New priorities for ``batch.indices``; stale keys are skipped."""
        return self.plane.update_priorities(indices, priorities)

    update_priorities = update_priority

    def __len__(self) -> int:
        return len(self.plane)

    def get_state(self) -> dict[str, Any]:
        """``{"meta": JSON-able dict, "arrays": {name: ndarray}}``: the whole buffer."""
        meta, arrays = self.plane.snapshot()
        return {"meta": meta, "arrays": arrays}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Replace the contents with :meth:`get_state` output (same spec)."""
        self.plane.load_snapshot(state["meta"], {k: np.asarray(v) for k, v in state["arrays"].items()})

    state_dict = get_state
    load_state_dict = set_state

    def __repr__(self) -> str:
        return f"ReplayBufferAdapter({self.plane!r}, batch_size={self.batch_size})"
