"""Writes tests/montecarlo/data/store_v1 with the store code of commit 84ff875 (before the durable layer)."""
import pathlib
import shutil
import sys

import numpy as np
from distributed import Client, LocalCluster

from dask_research import montecarlo as mc


def compat_pipe(a, b):
    return np.tanh(a * b)


class Count:
    def init(self):
        return {"n": 0, "s": 0.0}

    def update(self, state, y):
        return {"n": state["n"] + len(y), "s": state["s"] + float(np.sum(y))}

    def merge(self, a, b):
        return {"n": a["n"] + b["n"], "s": a["s"] + b["s"]}

    def finalize(self, state):
        return state["s"] / state["n"]


out = pathlib.Path(sys.argv[1])
shutil.rmtree(out, ignore_errors=True)
job = mc.Job(compat_pipe, {"a": mc.Normal(1.0, 0.1), "b": mc.Normal(2.0, 0.2)}, shards=8, samples_per_shard=64,
             seed=11, bins=8, name="compat")
ujob = mc.Job(compat_pipe, {"a": mc.Normal(1.0, 0.1), "b": mc.Normal(2.0, 0.2)}, shards=4, samples_per_shard=64,
              seed=12, reducer=Count(), name="compat-reducer")
with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cl, \
        Client(cl, set_as_default=False) as c:
    r = mc.run(job, client=c, store=str(out), progress=False, shards_per_task=4, verify=2)
    u = mc.run(ujob, client=c, store=str(out), progress=False, shards_per_task=2, verify=1)
print(job.id, r.mean.hex(), ujob.id, u.value)
