"""Model-based state machines: every plane operation checked against a trivially correct model."""
import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from dask_research.testing.replay import make_plane_machine


@pytest.mark.parametrize("storage, sampler", [
    ("host", "uniform"), ("host", "prioritized"), ("host", "recent"),
    ("tiered", "uniform"), ("tiered", "prioritized"),
])
def test_plane_against_model(storage, sampler):
    machine = make_plane_machine(storage=storage, sampler=sampler)
    run_state_machine_as_test(machine, settings=settings(max_examples=25, stateful_step_count=25,
                                                          deadline=None))
