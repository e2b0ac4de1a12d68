"""Hypothesis strategies and state machines shipped with dask-research.

Import the submodule for the capability you test, e.g.
``from dask_research.testing.montecarlo import sample_arrays``. Requires ``hypothesis``
(the ``[test]`` extra).
"""
