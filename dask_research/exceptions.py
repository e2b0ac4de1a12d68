"""Errors raised by dask-research.

Every error is a :class:`ResearchError`; subclasses keep the facts as attributes and format
them in ``__str__`` (the ``distributed.exceptions`` pattern), so callers can react to
``err.name`` or ``err.value`` and people read a sentence that says what was wrong and what
would be valid.

Examples
--------
>>> from dask_research.exceptions import InputError
>>> err = InputError("sd", -1.0, "a positive number", where="input 'a'")
>>> print(err)
input 'a': sd=-1.0 is invalid; expected a positive number
>>> isinstance(err, ValueError)
True
"""
from __future__ import annotations

from typing import Any


class ResearchError(Exception):
    """Base class of every error raised by dask-research."""


class InputError(ResearchError, ValueError):
    """A parameter has a value that cannot be used.

    Attributes: ``name`` (parameter), ``value`` (what was given), ``expected`` (what would be
    valid), ``where`` (the object it belongs to, e.g. ``"input 'a'"``).
    """

    def __init__(self, name: str, value: Any, expected: str, where: str | None = None):
        self.name = name
        self.value = value
        self.expected = expected
        self.where = where
        super().__init__(name, value, expected, where)

    def __str__(self) -> str:
        prefix = f"{self.where}: " if self.where else ""
        return f"{prefix}{self.name}={self.value!r} is invalid; expected {self.expected}"


class ConfigError(ResearchError, ValueError):
    """A ``research.*`` configuration value is missing or malformed."""

    def __init__(self, key: str, value: Any, expected: str):
        self.key = key
        self.value = value
        self.expected = expected
        super().__init__(key, value, expected)

    def __str__(self) -> str:
        return f"config research.{self.key}={self.value!r} is invalid; expected {self.expected}"


class PipelineError(ResearchError, ValueError):
    """A user pipeline returned something that cannot be accumulated.

    Attributes: ``shard`` (index or ``"pilot"``), ``problem`` (sentence), ``count`` (how many
    values were bad, if relevant).
    """

    def __init__(self, shard: int | str, problem: str, count: int | None = None):
        self.shard = shard
        self.problem = problem
        self.count = count
        super().__init__(shard, problem, count)

    def __str__(self) -> str:
        return f"pipeline output of shard {self.shard}: {self.problem}"


class MergerError(ResearchError):
    """A merge function violates a law it must obey (associativity, commutativity, identity).

    Attributes: ``law`` (which law), ``example`` (a readable counter-example), ``detail``.
    """

    def __init__(self, law: str, example: str, detail: str = ""):
        self.law = law
        self.example = example
        self.detail = detail
        super().__init__(law, example, detail)

    def __str__(self) -> str:
        msg = f"merger is not {self.law}: {self.example}"
        if self.detail:
            msg += f" ({self.detail})"
        return msg + "; a pool refuses mergers that fail check_merger"


class FileProblem(ResearchError):
    """A file the project reads or writes is refused (the base of each capability's file error).

    Attributes: ``path`` (the file, as shown), ``problem`` (sentence). Each capability raises its
    own subclass (:class:`StoreError`, :class:`CheckpointError`, :class:`ReportError`), which
    :class:`~dask_research.durable.Files` is given as its error type.
    """

    prefix = ""

    def __init__(self, path: str, problem: str):
        self.path = path
        self.problem = problem
        super().__init__(path, problem)

    def __str__(self) -> str:
        # A store may be a URL with credentials in it (s3://key:secret@bucket): never shown.
        return redact(f"{self.prefix}{self.path}: {self.problem}")


def redact(text: str) -> str:
    """``text`` with the credentials of every URL in it masked.

    >>> redact("s3://key:secret@bucket/runs: cannot be opened (gcs://u:pw@b)")
    's3://***@bucket/runs: cannot be opened (gcs://***@b)'
    """
    import re

    return re.sub(r"//[^/@\s]*@", "//***@", str(text))


class StoreError(FileProblem):
    """A run store file is missing, corrupt, foreign or would be overwritten."""


class ReportError(FileProblem):
    """An HTML report cannot be written where asked."""

    prefix = "report "


class VerificationError(ResearchError):
    """Spot-checked shards could not be reproduced and no clean worker was left to recompute."""

    def __init__(self, run_id: str, problem: str):
        self.run_id = run_id
        self.problem = problem
        super().__init__(run_id, problem)

    def __str__(self) -> str:
        return f"run {self.run_id[:12]}: {self.problem}"


class ExperimentError(ResearchError, ValueError):
    """Bad input to the experiment scheduler (duplicate ids, unknown branches, ...)."""

    def __init__(self, problem: str, **facts: Any):
        self.problem = problem
        self.facts = facts
        for k, v in facts.items():
            setattr(self, k, v)
        super().__init__(problem)

    def __str__(self) -> str:
        return self.problem


class CheckpointError(FileProblem):
    """A checkpoint is corrupt, foreign or unreadable."""

    prefix = "checkpoint "


class SpecError(ResearchError, ValueError):
    """A batch of transitions does not match the :class:`ExperienceSpec`.

    Attributes: ``field``, ``problem``.
    """

    def __init__(self, field: str | None, problem: str):
        self.field = field
        self.problem = problem
        super().__init__(field, problem)

    def __str__(self) -> str:
        if self.field is None:
            return self.problem
        return f"field {self.field!r}: {self.problem}"


class CapacityError(ResearchError, ValueError):
    """A request needs more memory than is declared. Attributes: ``needed``, ``available``, ``what``."""

    def __init__(self, what: str, needed: int, available: int):
        self.what = what
        self.needed = needed
        self.available = available
        super().__init__(what, needed, available)

    def __str__(self) -> str:
        return f"{self.what} needs {self.needed:,} bytes but only {self.available:,} are available"


class RateLimitTimeout(ResearchError, TimeoutError):
    """A rate-limited ingest or sample waited too long.

    Attributes: ``side`` (``"insert"`` or ``"sample"``: the side that was blocked), ``inserts``,
    ``samples``, ``ratio``, ``timeout``.
    """

    def __init__(self, side: str, inserts: int, samples: int, ratio: float, timeout: float):
        self.side = side
        self.inserts = inserts
        self.samples = samples
        self.ratio = ratio
        self.timeout = timeout
        super().__init__(side, inserts, samples, ratio, timeout)

    def __str__(self) -> str:
        other = "sampling" if self.side == "insert" else "inserting"
        return (
            f"{self.side} blocked for {self.timeout:g} s waiting for {other}: "
            f"{self.inserts:,} inserted, {self.samples:,} sampled, "
            f"samples-per-insert target {self.ratio:g}"
        )
