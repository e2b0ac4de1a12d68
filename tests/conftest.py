# Import dask_research before distributed.utils_test snapshots dask.config, so that the
# research.* defaults are part of the configuration every cluster test starts from.
import dask_research  # noqa: F401
