"""Data helpers shared by the replay tests (imported by name; tests/ has no packages)."""
import numpy as np

CARTPOLE = {"obs": ((4,), "float32"), "action": ((), "int64"), "reward": ((), "float32"),
            "next_obs": ((4,), "float32"), "done": ((), "bool")}


def make_batch(n, start=0, seed=0):
    """CartPole-shaped transitions whose ``action`` field is the key (start .. start + n)."""
    rng = np.random.default_rng(seed)
    return {"obs": rng.standard_normal((n, 4)).astype(np.float32),
            "action": np.arange(start, start + n, dtype=np.int64),
            "reward": rng.random(n).astype(np.float32),
            "next_obs": rng.standard_normal((n, 4)).astype(np.float32),
            "done": rng.random(n) < 0.1}



def plane_events(client, plane, kind, timeout=60.0):
    """The events ``kind`` of ``plane`` in the scheduler's log, once at least one is there: a plane
    ships its events in the background (batched, behind the call that made them), so a read right
    after that call can come before them on a busy machine (the stress gate saw it once)."""
    from dask_research.testing.processes import wait_for

    def found():
        return [m for _, m in client.get_events("research.replay")
                if m.get("plane") == plane.name and m.get("event") == kind]

    wait_for(lambda: bool(found()), timeout, f"a {kind!r} event of plane {plane.name!r}")
    return found()
