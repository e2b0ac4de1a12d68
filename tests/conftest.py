# Import dask_research before distributed.utils_test snapshots dask.config, so that the
# research.* defaults are part of the configuration every cluster test starts from.
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

# Every property and fuzz test draws the same examples on every run (derandomized, seeded by
# the test itself), so a run's result never depends on luck and a failure is reproduced by
# running the test again. `python -m pytest --hypothesis-profile=explore` draws new examples
# (and keeps the failing ones in .hypothesis/ to replay them first next time).
# No per-example deadline (Hypothesis's default is 200 ms): a wall-clock bound on one example
# fails on a busy 2-core machine (a doctest's example took 361 ms under the stress gate).
settings.register_profile("suite", derandomize=True, database=None, print_blob=True, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", parent=settings.get_profile("suite"))        # the name CI used
settings.register_profile("explore", print_blob=True, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("suite")
