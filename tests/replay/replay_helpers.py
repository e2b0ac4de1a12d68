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

