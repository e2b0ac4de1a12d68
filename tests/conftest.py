# Import dask_research before distributed.utils_test snapshots dask.config, so that the
# research.* defaults are part of the configuration every cluster test starts from.
import os

import dask
from hypothesis import HealthCheck, settings

import dask_research  # noqa: F401

# No statistical profiler in the in-process test clusters: its thread walks every thread's
# frames (sys._current_frames) every 10 ms, and on CPython 3.11 that walk can deadlock against
# a thread being torn down; a fresh-machine run of this suite once hung there for good. A test
# that needs the profiler turns it on for itself. Set before distributed.utils_test snapshots
# the configuration, so gen_cluster's clusters start from it too.
dask.config.set({"distributed.worker.profile.enabled": False})

# dask-jobqueue registers its defaults (jobqueue.slurm.*) when imported; import it before
# distributed.utils_test snapshots the configuration, or the cluster tests' config resets drop
# them and a later SLURMCluster fails with KeyError: 'interface'.
try:
    import dask_jobqueue  # noqa: F401
except ImportError:
    pass

# In CI the property and fuzz tests draw the same examples every run (derandomized), so a
# submission's result does not depend on luck; locally they explore new examples each run.
settings.register_profile("ci", derandomize=True, database=None,
                          suppress_health_check=[HealthCheck.too_slow])
if os.environ.get("CI"):
    settings.load_profile("ci")
