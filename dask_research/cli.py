"""The ``dask-research`` command line (click, like Dask's own CLI).

Examples
--------
.. code-block:: bash

    dask-research --version
    dask-research mc pilot examples/saturating_pipeline.py:job --target-stderr 1e-5
    dask-research mc run examples/saturating_pipeline.py:job
    dask-research mc run examples/saturating_pipeline.py:job --scheduler tcp://10.0.0.5:8786
    dask-research mc run examples/saturating_pipeline.py:job --cluster slurm --jobs 4 --cores 1 --memory 2GB
    dask-research worker tcp://10.0.0.5:8786 --nthreads 1      # in a batch script

Failures are one line on stderr: exit code 2 for what was typed (usage), 1 for what failed
while running; ``dask-research --traceback ...`` shows the full traceback.

>>> from click.testing import CliRunner
>>> CliRunner().invoke(main, ["--version"]).output
'dask-research, version ...'
>>> bad = CliRunner().invoke(main, ["mc", "run", "nope.py:job"])
>>> bad.exit_code, bad.output.splitlines()[0]
(2, "Error: Invalid value for MODULE:JOB: file 'nope.py' does not exist (see 'main mc run --help')")
"""
from __future__ import annotations

import contextlib
import os
from typing import Any

import click

from ._signals import interrupt_exit_code, terminate_as_interrupt
from ._version import __version__
from .cli_checks import Whole, check_address
from .jobfile import config_seconds, load_job, one_line
from .jobfile import load_object as load_object  # where tests and users have imported it from


def _scheduler_callback(ctx, param, value):
    """Check ``--scheduler`` while the arguments are parsed, before any work starts."""
    return None if value is None else check_address(value)


@contextlib.contextmanager
def _client(scheduler: str | None = None, cluster: str | None = None, jobs: int | None = None,
            **cluster_options: Any):
    """The client of ``--scheduler`` or ``--cluster``, or ``None`` (the embedded cluster)."""
    if scheduler is not None and cluster is not None:
        raise click.UsageError("give --scheduler or --cluster, not both")
    if cluster is not None:
        from .exceptions import InputError
        from .hpc import jobqueue_client

        started = False
        try:
            with jobqueue_client(cluster, jobs=jobs or 1, **cluster_options) as client:
                started = True
                yield client
        except InputError as e:
            if started:                   # the run's own, not the cluster's options
                raise
            raise click.BadParameter(str(e), param_hint=f"--{e.name}") from None
        return
    if scheduler is None:
        yield None
        return
    from distributed import Client

    from . import config

    address = check_address(scheduler)
    if address.startswith("tls://") and not _tls_configured():
        raise click.ClickException(
            f"cannot reach the scheduler at {address}: it speaks TLS and this client has no certificate; set "
            "distributed.comm.tls.ca-file, distributed.comm.tls.client.cert and distributed.comm.tls.client.key "
            "(DASK_DISTRIBUTED__COMM__TLS__CA_FILE=... or ~/.config/dask/; "
            "https://distributed.dask.org/en/latest/tls.html)")
    seconds = config_seconds("cli.connect-timeout", config.resolve("cli.connect-timeout"))
    client = _connect(Client, address, seconds)
    with client:
        if not client.scheduler_info().get("workers"):
            click.echo(f"the scheduler at {address} has no workers yet: the command waits for one to join "
                       f"(start one with: dask worker {address})", err=True)
        yield client


def _connect(client_class, address: str, seconds: float):
    """A client of ``address``, or one line saying why not within ``seconds``.

    ``Client(timeout=)`` bounds the connection, not the handshake: a port where something else
    listens (the dashboard's HTTP port, typed for the scheduler's) accepted the connection and
    the command then waited for ever without a word. The client is made on a daemon thread,
    waited for a bounded time."""
    import threading

    from ._compat import address_host_port

    box: dict = {}

    def make() -> None:
        try:
            box["client"] = client_class(address, timeout=seconds)
        except BaseException as e:      # noqa: BLE001 - handed to the caller's thread
            box["error"] = e

    bound = max(2 * seconds, seconds + 5.0)
    thread = threading.Thread(target=make, name="research-connect", daemon=True)
    thread.start()
    thread.join(bound)
    if thread.is_alive():
        raise click.ClickException(
            f"cannot reach the scheduler at {address}: something accepts connections there but did not answer "
            f"as a Dask scheduler within {bound:g} s (the dashboard's port? a scheduler listens on 8786 unless "
            "told otherwise)")
    e = box.get("error")
    if e is None:
        return box["client"]
    if not isinstance(e, (OSError, TimeoutError)):
        raise e
    reason = (f"no answer within {seconds:g} s (research.cli.connect-timeout)"
              if "timed out" in str(e).lower() or isinstance(e, TimeoutError) else one_line(e))
    host = address_host_port(address if "://" in address else f"tcp://{address}")[0]
    if host and not _resolves(host):
        reason = f"the host name {host!r} does not resolve (a typo? or not on this network)"
    raise click.ClickException(f"cannot reach the scheduler at {address}: {reason}") from None


def _resolves(host: str) -> bool:
    import socket

    try:
        socket.getaddrinfo(host, None)
    except (socket.gaierror, UnicodeError):
        return False
    except OSError:
        pass                    # another failure: not a name that does not resolve
    return True


def _tls_configured() -> bool:
    """Whether Dask's configuration gives a client a TLS context (``distributed.comm.tls.*``)."""
    from distributed import Security

    return Security().get_connection_args("client").get("ssl_context") is not None


class _UsageError(click.UsageError):
    """A usage error shown on one line (exit code 2): the problem, then where help is."""

    def show(self, file=None) -> None:
        hint = f" (see '{self.ctx.command_path} --help')" if self.ctx is not None else ""
        click.echo(f"Error: {self.format_message()}{hint}", err=True, file=file)


def _one_line_usage(e: click.UsageError) -> _UsageError:
    if isinstance(e, _UsageError):
        return e
    return _UsageError(e.format_message(), e.ctx)


#: Commands imported only when they run (name -> (module:attribute, the help listing's line)), so
#: ``--help``, ``--version`` and argument errors import neither ``distributed`` nor a capability.
_LAZY_COMMANDS = {
    "worker": ("dask_research.montecarlo.power_cli:worker_command",
               "Run `dask worker SCHEDULER` with the own-device power policy."),
}


class _Main(click.Group):
    """The command group. Every failure is one line on stderr: usage errors (what was typed:
    arguments, options, the job file) exit with 2, failures while running (a scheduler that
    does not answer, a store, the pipeline) with 1; a traceback only with ``--traceback``."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *_LAZY_COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in _LAZY_COMMANDS and cmd_name not in self.commands:
            import importlib

            module, _, attr = _LAZY_COMMANDS[cmd_name][0].partition(":")
            self.add_command(getattr(importlib.import_module(module), attr), name=cmd_name)
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(map(len, names), default=0)
        rows = []
        for name in names:
            if name in _LAZY_COMMANDS and name not in self.commands:
                rows.append((name, _LAZY_COMMANDS[name][1]))
                continue
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                rows.append((name, cmd.get_short_help_str(limit)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def make_context(self, *args, **kwargs) -> click.Context:
        try:
            return super().make_context(*args, **kwargs)
        except click.UsageError as e:
            raise _one_line_usage(e) from None

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except click.UsageError as e:
            cause = e.__cause__ if e.__cause__ is not None else (None if e.__suppress_context__ else e.__context__)
            if ctx.meta.get("dask_research.traceback") and cause is not None:
                import traceback  # what went wrong inside the job file, as asked for

                click.echo("".join(traceback.format_exception(cause)).rstrip(), err=True)
            raise _one_line_usage(e) from None
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort, SystemExit,
                KeyboardInterrupt):
            raise
        except Exception as e:
            if ctx.meta.get("dask_research.traceback"):
                raise
            raise click.ClickException(_describe_failure(e)) from None


def _describe_failure(e: BaseException) -> str:
    """A failure as the one line the command prints (control characters from a file name or a
    hostile store escaped, so the line can neither forge another nor drive the terminal)."""
    from .durable import printable
    from .exceptions import InputError, ResearchError

    if isinstance(e, InputError):
        line = str(e)
    elif isinstance(e, ResearchError):
        line = str(e).splitlines()[0] if str(e) else type(e).__name__
    else:
        line = f"{one_line(e)} (run with dask-research --traceback ... for details)"
    return printable(line, 4000)


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="dask-research")
@click.option("--traceback", "show_traceback", is_flag=True,
              help="Show the full Python traceback of a failure instead of one line.")
@click.pass_context
def main(ctx: click.Context, show_traceback: bool) -> None:
    """Research workflows on Dask: Monte-Carlo, experiment scheduling, experience replay."""
    ctx.meta["dask_research.traceback"] = show_traceback


@main.group()
def mc() -> None:
    """Sharded, verified, replayable Monte-Carlo."""


_job_arg = click.argument("job_ref", metavar="MODULE:JOB")


def _job_options(f):
    f = click.option("--shards", type=Whole(min=1), help="Override the job's shard count.")(f)
    f = click.option("--seed", type=Whole(min=0), help="Override the job's root seed.")(f)
    return f


def _apply_overrides(job, shards, seed):
    from .exceptions import InputError

    changes = {k: v for k, v in (("shards", shards), ("seed", seed)) if v is not None}
    try:
        return job.replace(**changes) if changes else job
    except InputError as e:
        raise click.BadParameter(str(e), param_hint=f"--{e.name}" if e.name in changes else None) from None


class _PositiveFloat(click.ParamType):
    """A finite number above zero (``nan``, ``inf`` and ``-1`` are usage errors)."""

    name = "POSITIVE_NUMBER"

    def convert(self, value, param, ctx):
        import math

        try:
            x = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number; expected a finite number above 0", param, ctx)
        if not (math.isfinite(x) and x > 0):
            self.fail(f"{value!r} is invalid; expected a finite number above 0", param, ctx)
        return x


class _PowerOfTwo(click.ParamType):
    """A power of two (1, 2, 4, ...): ``--shards-per-task 3`` is a usage error before anything runs.

    >>> _PowerOfTwo().convert("8", None, None)
    8
    """

    name = "POWER_OF_TWO"

    def convert(self, value, param, ctx):
        try:
            n = int(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a whole number; expected a power of two (1, 2, 4, 8, ...)", param, ctx)
        if n < 1 or n & (n - 1):
            below = 1 << max(0, n.bit_length() - 1) if n > 0 else 1
            hint = f" (e.g. {below} or {below * 2})" if n > 1 else ""
            self.fail(f"{value!r} is not a power of two{hint}: tasks compute aligned subtrees of the "
                      "reduction tree", param, ctx)
        return n


class _Memory(click.ParamType):
    """A memory size per batch job (``4GB``, ``1.5GiB``, ``512MB``): checked before any job is
    submitted, so a typo is a usage error, not a job the batch system refuses minutes later.

    >>> _Memory().convert("4GB", None, None)
    '4GB'
    """

    name = "SIZE"

    def convert(self, value, param, ctx):
        from dask.utils import parse_bytes

        try:
            n = parse_bytes(str(value))
        except (TypeError, ValueError):
            n = None
        if n is None or n <= 0:
            self.fail(f"{value!r} is not a memory size; expected a positive size such as 4GB, 1.5GiB "
                      "or 512MB", param, ctx)
        return value


class _Walltime(click.ParamType):
    """A batch job's time limit in the forms SLURM and PBS accept (``MM``, ``MM:SS``,
    ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``), longer than zero.

    >>> _Walltime().convert("01:30:00", None, None), _Walltime().convert("2-12", None, None)
    ('01:30:00', '2-12')
    """

    name = "TIME"
    _FORMS = (r"(\d+)", r"(\d+):(\d+)", r"(\d+):(\d+):(\d+)",
              r"(\d+)-(\d+)", r"(\d+)-(\d+):(\d+)", r"(\d+)-(\d+):(\d+):(\d+)")

    def convert(self, value, param, ctx):
        import re

        text = str(value).strip()
        parts = next((m.groups() for form in self._FORMS if (m := re.fullmatch(form, text))), None)
        if parts is None or not any(int(p) for p in parts):
            self.fail(f"{value!r} is not a time limit; expected HH:MM:SS (e.g. 01:00:00), minutes (90), "
                      "or D-HH:MM:SS (1-12:00:00), longer than zero", param, ctx)
        return text


def _scheduler_options(f):
    """``--scheduler`` and the dask-jobqueue options (``--cluster NAME --jobs N ...``)."""
    from .hpc import JOBQUEUE_CLUSTERS

    opts = [
        click.option("--scheduler", metavar="ADDRESS", callback=_scheduler_callback,
                     help="A running scheduler (tcp://HOST:PORT); default: an embedded LocalCluster."),
        click.option("--cluster", type=click.Choice(sorted(JOBQUEUE_CLUSTERS), case_sensitive=False),
                     help="Start a dask-jobqueue cluster of this kind (its settings: jobqueue.<name>.*)."),
        click.option("--jobs", type=Whole(min=1), default=None,
                     help="With --cluster: batch jobs to submit.  [default: 1]"),
        click.option("--queue", help="With --cluster: the queue or partition."),
        click.option("--account", help="With --cluster: the account to charge."),
        click.option("--cores", type=Whole(min=1), help="With --cluster: cores per job."),
        click.option("--memory", type=_Memory(), help="With --cluster: memory per job, e.g. 4GB."),
        click.option("--walltime", type=_Walltime(), help="With --cluster: the job's time limit, e.g. 01:00:00."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


@contextlib.contextmanager
def _cluster_client(scheduler, cluster, jobs, queue, account, cores, memory, walltime, store=None):
    """:func:`_client` for the command's options; a batch log directory it made stays only if a
    job wrote into it (a cluster that never started leaves no empty ``logs/`` behind)."""
    from .durable import missing_dirs, remove_empty_dirs

    given = {"--jobs": jobs, "--queue": queue, "--account": account, "--cores": cores, "--memory": memory,
             "--walltime": walltime}
    if cluster is None and any(v is not None for v in given.values()):
        flag = next(k for k, v in given.items() if v is not None)
        raise click.UsageError(f"{flag} applies only with --cluster NAME (a dask-jobqueue cluster)")
    logs = _job_log_directory(cluster, store) if cluster is not None else None
    made = missing_dirs(logs) if logs is not None else []
    if logs is not None:
        os.makedirs(logs, exist_ok=True)
    try:
        with _client(scheduler, cluster, jobs, queue=queue, account=account, cores=cores, memory=memory,
                     walltime=walltime, log_directory=logs) as client:
            yield client
    except BaseException:
        remove_empty_dirs(made)
        raise


def _job_log_directory(cluster: str, store: str | None) -> str | None:
    """Where ``--cluster``'s batch jobs write their logs, said in one line (issue 29: they were
    ``slurm-1.out``, ``slurm-2.out`` in the working directory): ``jobqueue.<name>.log-directory``
    if set, else ``<store>/logs`` for a local store, else ``dask-research-logs``."""
    import dask

    if dask.config.get(f"jobqueue.{cluster.lower()}.log-directory", default=None):
        return None                                    # dask-jobqueue's own setting applies
    local = store is not None and "://" not in store or (store or "").startswith("file://")
    path = os.path.join(store.removeprefix("file://"), "logs") if store is not None and local else "dask-research-logs"
    path = os.path.abspath(path)
    click.echo(f"batch job logs: {path}/ (set jobqueue.{cluster.lower()}.log-directory to change)", err=True)
    return path


@mc.command("run")
@_job_arg
@_job_options
@_scheduler_options
@click.option("--store", metavar="URL", help="Run store (path or fsspec URL): persist shards, resume, replay.")
@click.option("--verify", type=Whole(min=0), help="Shards recomputed and compared, on another worker where there is one (default from config).")
@click.option("--shards-per-task", type=_PowerOfTwo(), help="A power of two; default from pilot timing.")
@click.option("--progress/--no-progress", default=None, help="Show a progress bar (default from config).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def mc_run(job_ref, shards, seed, scheduler, cluster, jobs, queue, account, cores, memory, walltime,
           store, verify, shards_per_task, progress, as_json):
    """Run the Job object JOB defined in MODULE (a file path or module name).

    On an embedded LocalCluster by default, on a running scheduler with --scheduler, or on
    batch jobs with --cluster slurm --jobs N (closed at the end).
    """
    from . import montecarlo

    job = _apply_overrides(load_job(job_ref), shards, seed)
    _check_store(store, creating=True)
    try:
        with _cluster_client(scheduler, cluster, jobs, queue, account, cores, memory, walltime, store) as client, \
                _quiet_reported_task_failures(), terminate_as_interrupt():
            result = montecarlo.run(job, client=client, store=store, verify=verify,
                                    shards_per_task=shards_per_task, progress=progress)
    except KeyboardInterrupt as e:
        stop = click.ClickException(_interrupted(job, store))
        stop.exit_code = interrupt_exit_code(e)     # 130 (Ctrl-C) or 143 (SIGTERM): not a failure's 1
        raise stop from None
    click.echo(result.to_json() if as_json else str(result))
    if store and not as_json:
        from .montecarlo.store.layout import RUNS_DIR

        click.echo(f"  stored               {_redact(store).rstrip('/')}/{RUNS_DIR}/{result.run_id}")


class _ReportedFailures:
    """A logging filter that drops Dask's multi-line "Compute Failed" worker log for a failure the
    command reports itself in one line (a ``dask_research`` error: a NaN, a bad shape), and the
    "Async instruction ... ended with CancelledError" warnings of the tasks still running when a
    failed or interrupted run closes its cluster (its one line says what happened)."""

    def filter(self, record) -> bool:
        msg = str(record.msg)
        if msg.startswith("Async instruction for ") and msg.endswith("ended with CancelledError"):
            return False
        if not msg.startswith("Compute Failed"):
            return True
        args = record.args if isinstance(record.args, tuple) else ()
        text = str(args[3]) if len(args) > 3 else ""
        return not text.startswith(("PipelineError(", "InputError(", "ResearchError("))


@contextlib.contextmanager
def _quiet_reported_task_failures():
    """While a run goes, the in-process workers of the embedded cluster do not log what the run's
    one-line error says anyway (issue 28: a late NaN printed 6 lines of Dask's worker log first)."""
    import logging

    keep = _ReportedFailures()
    logs = [logging.getLogger("distributed.worker"), logging.getLogger("distributed.worker.state_machine")]
    for log in logs:
        log.addFilter(keep)
    try:
        yield
    finally:
        for log in logs:
            log.removeFilter(keep)


def _interrupted(job, store: str | None) -> str:
    """What an interrupted run leaves: the shards stored, and how to go on."""
    if not store:
        return "interrupted; nothing was stored (without --store a run cannot resume)"
    try:
        from .montecarlo.run import open_store

        opened = open_store(store)
        assert opened is not None               # a store address always opens a store
        n = len(opened.read_shards(job.id, decoder=lambda doc: None))
    except Exception:  # noqa: BLE001 - a damaged store: say what we can
        return f"interrupted; the shards stored in {_redact(store)} are kept: the same command resumes"
    return (f"interrupted: {n} of {job.shards} shards are stored in {_redact(store)}; "
            "the same command resumes from them")


def _redact(url: str) -> str:
    from .montecarlo.store import redact

    return redact(url)


def _check_store(store: str | None, creating: bool = False) -> None:
    """``--store``, checked before a scheduler is asked or a batch job submitted, writing nothing:
    a path or an fsspec URL whose protocol is known and installed (issue 28: an unknown protocol
    or an empty path was a run failure, exit 1, after ``--scheduler`` had connected or
    ``--cluster`` had submitted its jobs); with ``creating`` (``mc run``), not a file. Whether it
    can be created or read is the run's to say.

    >>> _check_store("runs/")
    >>> _check_store("nosuchproto://bucket/runs")
    Traceback (most recent call last):
    ...
    click.exceptions.BadParameter: 'nosuchproto://bucket/runs' cannot be opened as a store (ValueError: ...
    """
    if store is None:
        return
    from .exceptions import InputError, StoreError
    from .montecarlo.run import open_store

    try:
        opened = open_store(store)
    except (InputError, StoreError) as e:
        problem = e.problem if isinstance(e, StoreError) else "is empty"
        raise click.BadParameter(
            f"{_redact(store)!r} {problem}; expected a local path or an fsspec URL whose protocol is installed "
            "(runs/, file:///data/runs, memory://runs, s3://bucket/runs with s3fs)", param_hint="--store") from None
    found = opened.files.root_problem() if opened is not None and creating else None
    if found is not None:                  # a file where the store would be: never a run store
        raise click.BadParameter(f"{_redact(store)!r} {found}", param_hint="--store")


class _ShardList(click.ParamType):
    """Comma-separated shard indices, each a whole number >= 0, each once.

    >>> _ShardList().convert("3,0,17", None, None)
    [3, 0, 17]
    """

    name = "I,J,..."

    def convert(self, value, param, ctx):
        if isinstance(value, list):
            return value
        items = [x.strip() for x in str(value).split(",")]
        if not all(x.isdigit() for x in items):
            self.fail(f"{value!r} is not a comma-separated list of shard indices; expected whole numbers "
                      ">= 0 separated by commas, e.g. 0,5,17", param, ctx)
        picks = [int(x) for x in items]
        if len(set(picks)) < len(picks):
            self.fail(f"{value!r} names a shard twice; expected each shard index once, e.g. 0,5,17", param, ctx)
        return picks


@contextlib.contextmanager
def _shard_out_of_range(flag: str):
    """A shard index past the run's last (known once the store is read) is a usage error too."""
    from .exceptions import InputError

    try:
        yield
    except InputError as e:
        if e.name != "shard":
            raise
        raise click.BadParameter(str(e), param_hint=flag) from None


def _check_read_store(store: str) -> None:
    """``--store`` of a read command (show, replay, verify): :func:`_check_store`, and the store
    must exist. A path that does not exist, is a file or is a dangling link is a usage error
    (exit 2, one line), as a bad ``--shard`` is, not a failure of the command (exit 1).
    """
    from .exceptions import StoreError
    from .montecarlo.run import open_store

    _check_store(store)
    try:
        open_store(store, must_exist=True)
    except StoreError as e:
        raise click.BadParameter(f"{e.path}: {e.problem}", param_hint="--store") from None


@contextlib.contextmanager
def _run_prefix():
    """RUN that is not a hex prefix, or that several runs' ids start with, is a usage error too;
    so is a replay or verify without ``--job`` (or ``--trust-origin``), which cannot work."""
    from .montecarlo.audit import PipelineNotGiven
    from .montecarlo.store import BadRunId

    try:
        yield
    except BadRunId as e:
        raise click.BadParameter(e.problem, param_hint="RUN") from None
    except PipelineNotGiven as e:       # the command cannot work without it: a usage error too
        raise click.BadParameter(f"missing: the run's pipeline is {e.recorded}, and a store never chooses the code "
                                 "that runs; give --job FILE:JOB (your copy of the job that ran), or --trust-origin "
                                 "to import what the run recorded (only for a store you trust)",
                                 param_hint="--job") from None


@contextlib.contextmanager
def _one_line_store_warnings():
    """A store's warning (a foreign file ignored, result.json disagreeing with its shards) as one
    line, ``Warning: <file>: <problem>``, on stderr; Python's format added this package's source
    file, line number and line of code."""
    import warnings

    from .durable import printable
    from .montecarlo.store import StoreWarning

    with warnings.catch_warnings():
        shown = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if issubclass(category, StoreWarning):
                click.echo(f"Warning: {printable(message, 2000)}", err=True)   # a file's name is anyone's
            else:
                shown(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        yield


_store_opt = click.option("--store", metavar="URL", required=True, help="The run store (path or fsspec URL).")
_job_opt = click.option("--job", "job_ref", metavar="FILE:JOB or MODULE:JOB",
                        help="The job that ran: the pipeline always comes from you, never from the store "
                             "(a run made with --shards/--seed is checked with the shard count and seed it recorded).")
_trust_opt = click.option("--trust-origin", is_flag=True,
                          help="Import the module or file the manifest names (only for stores you trust).")


@mc.command("replay")
@click.argument("run_id", metavar="RUN")
@click.option("--shard", type=Whole(min=0), required=True, help="The shard to recompute alone.")
@_store_opt
@_job_opt
@_trust_opt
def mc_replay(run_id, shard, store, job_ref, trust_origin):
    """Recompute one shard of RUN alone and compare it with the stored accumulator."""
    from . import montecarlo

    _check_read_store(store)
    job = load_job(job_ref) if job_ref else None
    with _shard_out_of_range("--shard"), _run_prefix(), _one_line_store_warnings():
        report = montecarlo.replay(run_id, shard, store, job=job, trust_origin=trust_origin or None)
    click.echo(str(report))
    _note_recorded_partitioning(job, report)
    if not report.match:
        raise SystemExit(1)


def _note_recorded_partitioning(job: Any, report: Any) -> None:
    """Say so when the job given (``--job``) has another shard count or seed than the run: the
    shards were recomputed as the run recorded them, not as the file says."""
    if job is None or report is None or report.of_shards is None:
        return
    pairs = [("shards {:,}", job.shards, report.of_shards), ("seed {}", job.seed, report.seed)]
    differ = [(form.format(mine), form.format(run)) for form, mine, run in pairs if run is not None and mine != run]
    if differ:
        click.echo(f"  (the job given has {', '.join(m for m, _ in differ)}; recomputed as the run recorded it: "
                   f"{', '.join(r for _, r in differ)})")


@mc.command("verify")
@click.argument("run_id", metavar="RUN")
@click.option("-k", "k", type=Whole(min=1), default=4, show_default=True,
              help="Shards chosen from the hash of the run id.")
@click.option("--shards", type=_ShardList(), help="Comma-separated shard indices instead of -k.")
@_store_opt
@_job_opt
@_trust_opt
def mc_verify(run_id, k, shards, store, job_ref, trust_origin):
    """Recompute several shards of RUN locally and compare them with the store."""
    from . import montecarlo

    if shards is not None and click.get_current_context().get_parameter_source("k") is \
            click.core.ParameterSource.COMMANDLINE:     # -k was silently ignored
        raise click.UsageError("-k and --shards exclude each other: give a number of hashed shards or a list, "
                               "not both")
    _check_read_store(store)
    job = load_job(job_ref) if job_ref else None
    with _shard_out_of_range("--shards"), _run_prefix(), _one_line_store_warnings():
        reports = montecarlo.replay_many(run_id, store, shards=shards, k=k, job=job,
                                         trust_origin=trust_origin or None)
    for r in reports:
        click.echo(str(r))
    _note_recorded_partitioning(job, reports[0] if reports else None)
    bad = [r for r in reports if not r.match]
    click.echo(f"{len(reports) - len(bad)} of {len(reports)} shards reproduced exactly{_verify_scope(reports)}")
    if bad:
        raise SystemExit(1)


def _verify_scope(reports: list) -> str:
    """What ``mc verify`` checked of the run, for its last line: every shard, or a sample of the
    run's shards, or of those an incomplete run has stored.

    >>> from types import SimpleNamespace as R
    >>> _verify_scope([R(of_shards=8, stored_shards=8)] * 2)
    " (a sample: 2 of the run's 8 shards re-run, the other 6 not checked)"
    >>> _verify_scope([R(of_shards=640, stored_shards=320)] * 2)
    ' (a sample: 2 of the 320 shards this incomplete run has stored (320 of 640) re-run, the other 318 not checked)'
    """
    total = reports[0].of_shards if reports else None
    held = reports[0].stored_shards if reports and reports[0].stored_shards is not None else total
    n = len(reports)
    if total is None or held is None:
        return ""
    if n >= total:
        return " (every shard of the run)"
    if held >= total:
        return f" (a sample: {n} of the run's {total} shards re-run, the other {total - n} not checked)"
    if n < held:
        return (f" (a sample: {n} of the {held} shards this incomplete run has stored ({held} of {total}) re-run, "
                f"the other {held - n} not checked)")
    return f" (every shard this incomplete run has stored: {held} of {total})"


@mc.command("show")
@click.argument("run_id", metavar="[RUN]", required=False)
@_store_opt
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def mc_show(run_id, store, as_json):
    """List the runs in a store, or show one run (a prefix of its id is enough)."""
    import json

    from . import montecarlo
    from .durable import printable

    _check_read_store(store)
    with _run_prefix(), _one_line_store_warnings():
        info = montecarlo.show(run_id, store)
    if as_json:
        click.echo(json.dumps(info, indent=2, default=str))
        return
    if run_id is None:
        n = len(info["runs"])
        click.echo(f"{n} run{'' if n == 1 else 's'} in {_redact(store)}")
        for r in info["summaries"]:
            if "problem" in r:
                click.echo(f"  {r['run_id']}  (unreadable: {printable(r['problem'])})")
                continue
            left = "" if r["stored_shards"] >= r["shards"] else " (incomplete: run it again to resume)"
            click.echo(f"  {r['run_id']}  {printable(r['name'])}, created {printable(r['created'])}, "
                       f"{r['stored_shards']} of {r['shards']} shards stored{left}")
        return
    click.echo(f"run {info['run_id']} ({printable(info['name'])}), created {printable(info['created'])}")
    click.echo(f"  shards stored {info['stored_shards']} of {info['shards']}"
               f"{'' if info['complete'] else ' (incomplete: run it again to resume)'}")
    res = info["result"]
    if res and res.get("mean") is not None:         # recomputed from the stored shards by show
        from .montecarlo.result import mean_text, reused_sentence, verification_sentence

        click.echo(f"  mean {mean_text(res['mean'], res['stderr'])}; output sd {res['sd']:.6g}, "
                   f"n {res['n']:,} (recomputed from the stored shards)")
        if res.get("verification"):        # the run's own record: show re-runs no shard
            click.echo(f"  verified {printable(verification_sentence(res), 2000)} (as the run recorded it; "
                       "not re-run by show: mc verify RUN re-runs shards)")
        reused = reused_sentence(res) if "result_mismatch" not in res else None
        if reused:
            click.echo(f"  reused shards {printable(reused, 2000)}")
    elif res and res.get("result_checked") is False:
        click.echo("  result: the state of a user reducer, which show cannot recompute without its code; "
                   "check the shards with mc verify RUN --store ... --job FILE:JOB")


@mc.command("pilot")
@_job_arg
@_job_options
@click.option("--target-stderr", type=_PositiveFloat(), help="Plan the shards needed for this standard error.")
@_scheduler_options
def mc_pilot(job_ref, shards, seed, target_stderr, scheduler, cluster, jobs, queue, account, cores, memory,
             walltime):
    """Run the pilot shard of JOB: spread, histogram range, time per shard, and a plan."""
    from . import montecarlo
    from .exceptions import ResearchError

    job = _apply_overrides(load_job(job_ref), shards, seed)
    try:
        p = montecarlo.pilot(job)
    except ResearchError as e:
        raise click.ClickException(_describe_failure(e)) from None
    if target_stderr is not None:                 # a usage error prints nothing else
        _check_reachable(p.sigma, target_stderr, job)
    click.echo(f"job {job.id}")
    click.echo(f"pilot: mean {p.mean:.6g}, sigma {p.sigma:.6g}, range {p.range}, "
               f"{p.shard_seconds * 1e3:.2f} ms per shard of {job.samples_per_shard:,}")
    if target_stderr is not None:
        with _cluster_client(scheduler, cluster, jobs, queue, account, cores, memory, walltime) as client:
            click.echo(str(p.plan(target_stderr, client=client)))


def _check_reachable(sigma: float, target_stderr: float, job) -> None:
    """A usage error when no job can reach ``target_stderr`` (``1e-300`` was an OverflowError)."""
    import math

    from .montecarlo.philox import MAX_SHARDS

    most = (MAX_SHARDS - 1) * job.samples_per_shard
    # stderr = sigma / sqrt(samples): the smallest a job can reach, computed without overflow
    floor = sigma / math.sqrt(most) if math.isfinite(sigma) else math.inf
    if sigma > 0 and target_stderr < floor:
        raise click.BadParameter(
            f"{target_stderr:g} is out of reach: with the pilot's sigma {sigma:.3g}, even the most shards a job can "
            f"have ({MAX_SHARDS - 1:,} x {job.samples_per_shard:,} samples) give a stderr of {floor:.3g}; "
            "ask for a larger target", param_hint="--target-stderr")


def _check_demo_paths(out: str, store: str | None) -> tuple[str, str | None]:
    """The report path and run store, checked before the demo runs (one line if not usable)."""
    import os
    import stat

    from .demo import check_out_path, check_store_path
    from .exceptions import InputError

    try:
        out = check_out_path(out)
    except InputError as e:
        raise click.BadParameter(str(e), param_hint=f"--{e.name}") from None
    # the report is never written through a link or onto a special file (html_report refuses them):
    # say so now, not after the whole demo ran
    mode = os.lstat(out).st_mode if os.path.lexists(out) else None
    if mode is not None and not stat.S_ISREG(mode):
        what = "a symbolic link" if stat.S_ISLNK(mode) else "not a regular file"
        raise click.BadParameter(f"{out!r} is {what}; expected a regular file or a new path for the HTML report "
                                 "(a link is never followed)", param_hint="--out")
    _check_store(store)                                 # an empty --store, or a URL's protocol
    try:
        return out, (check_store_path(store) if store is not None else None)
    except InputError as e:
        raise click.BadParameter(str(e), param_hint=f"--{e.name}") from None


@main.command("demo")
@click.option("--out", default="dask-research-report.html", show_default=True, help="Where to write the HTML report.")
@click.option("--quick", is_flag=True, help="A smaller run: 64 Monte-Carlo shards (not 320), 60 experiments "
              "(not 180), 300 learner steps (not 1,500).")
@click.option("--store", metavar="PATH", default=None,
              help="Where to keep the demo's run store (default: dask-research-demo-store/ next to the report).")
@click.option("--scheduler", metavar="ADDRESS", callback=_scheduler_callback,
              help="Run on this cluster instead of an embedded one.")
def demo(out, quick, store, scheduler):
    """Run all three capabilities on an embedded cluster and write an HTML report."""
    from .demo import run_demo

    try:
        import bokeh  # noqa: F401
    except ImportError:
        raise click.ClickException("the demo's report needs bokeh: pip install 'dask-research[dashboard]'") from None
    out, store = _check_demo_paths(out, store)         # and a URL's protocol, before the cluster starts
    with _client(scheduler) as client, _quiet_reported_task_failures():
        run_demo(out=out, quick=quick, client=client, store=store)



if __name__ == "__main__":  # pragma: no cover
    main()
