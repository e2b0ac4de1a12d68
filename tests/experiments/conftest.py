"""Fixtures for the experiment-scheduler tests.

The blocking-API fixtures come from ``distributed.utils_test`` (``client`` starts a real
multi-process cluster); they are imported here only, not in a top-level conftest.
"""
from distributed.utils_test import (  # noqa: F401
    cleanup,
    client,
    cluster_fixture,
    loop,
    loop_in_thread,
)
