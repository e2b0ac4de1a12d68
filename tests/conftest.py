# Import dask_research before distributed.utils_test snapshots dask.config, so that the
# research.* defaults are part of the configuration every cluster test starts from.
import os

from hypothesis import HealthCheck, settings

import dask_research  # noqa: F401

# In CI the property and fuzz tests draw the same examples every run (derandomized), so a
# submission's result does not depend on luck; locally they explore new examples each run.
settings.register_profile("ci", derandomize=True, database=None,
                          suppress_health_check=[HealthCheck.too_slow])
if os.environ.get("CI"):
    settings.load_profile("ci")
