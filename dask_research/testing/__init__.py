"""Test helpers shipped with dask-research: the one place the project's tests take them from.

Import the submodule for the capability you test, e.g.
``from dask_research.testing.montecarlo import sample_arrays``:

* Hypothesis strategies and state machines: :mod:`.montecarlo`, :mod:`.experiments`,
  :mod:`.replay`, :mod:`.corruption` (they require ``hypothesis``, the ``[test]`` extra);
* real processes and machines: :mod:`.processes` (free ports, ``dask`` processes, a fresh
  ``python``, stopping what a test started), :mod:`.threads` (a call in flight while the test
  acts), :mod:`.slurm`, :mod:`.browser`;
* failure injection and workloads: :mod:`.faults`, :mod:`.pipelines`, :mod:`.rl`;
* stand-ins: :mod:`.fake_cluster` (a Dask client whose workers and replay shards live in this process);
* collection: :mod:`.optional` (which optional dependency a module needs at import), and
  :mod:`.ast_guard` (a CPython 3.11 bug that fails ``ast.parse`` at random).

A helper two test files need goes here, with a docstring example, rather than into either file.
"""
