from distributed.utils_test import cleanup, loop, loop_in_thread  # noqa: F401
