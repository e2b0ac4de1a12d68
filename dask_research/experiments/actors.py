"""``transport="actors"`` (the default): each slot's experiments run in a long-lived Dask actor.

With ``transport="tasks"`` (:class:`~.backends.DaskBackend`) every experiment is one Dask task:
the scheduler handles its submission, its placement, its result and its release (about 1.6-2.2
ms of scheduler CPU per experiment on the machine of :doc:`peers`). With actors
(``research.experiments.transport``) the scheduler places one actor per slot and its holder
task, once, and then never sees an experiment: the driver calls the slot's actor on its worker
(directly with ``direct_to_workers=True`` or on an embedded cluster, else through the
scheduler's ``proxy`` handler), the holder's thread runs the experiment, and the result comes
back on the same connection.

- **One actor per slot**, :class:`SlotActor`, created with ``client.submit(SlotActor, ...,
  actor=True, workers=[address])`` on a worker chosen so that no worker holds more of this run's
  actors than it has threads. The runner is pickled once per actor (it travels with the actor's
  creation, not with each experiment).
- **Queue-ahead lives in the actor**: a queued experiment is sent to the slot's actor at once,
  and the holder's thread starts it the moment the one before it ends, without a round trip.
  Every call carries a number (0, 1, 2, ... per actor); the actor runs them in that order,
  whatever order the calls arrive in, and a call repeated with the same number (after a lost
  connection) waits for the same experiment instead of running it again.
- **A worker that dies** (its connection closes, and the scheduler marks the actor's future
  lost): the slot's actor is created again on a live worker, and every experiment of the dead
  actor that had not returned is sent there again, in its order: the one that was running runs
  once more, the queued ones once. When no worker has a thread to spare, the slot shares the
  actor of another slot (one experiment at a time each) until one does.
- **Timeouts** count from an experiment's start (when it is sent to an idle actor, or when the
  one before it in its actor returns): the backend reports it with ``on_start``. An experiment
  that times out keeps its thread (a thread cannot be killed), so the slot moves: its actor
  retires (it starts nothing more and hands back the experiments queued in it), and the slot's
  next experiments go to a new actor, on another worker if this one has no thread to spare. A
  frozen worker does not answer; its actor's queued experiments are moved after
  :data:`MOVE_AFTER` seconds, and an actor whose experiment ran for ``timeout`` or longer never
  starts another one, so a worker that thaws does not run them too.
- **A driver that dies**: the scheduler releases its client's actors, and an actor released
  starts nothing more (what was queued in it is not run; a resume dispatches it again).
- **A lost scheduler** (the client's status leaves ``"running"``): the workers close with it,
  and no actor can be placed again. Every experiment in flight is handed back to the driver as
  cancelled on the cluster (:class:`~.backends.ClusterCancelled`), which stops the run as the
  tasks transport does: one line, nothing counted, the journal kept for a resume. It used to
  wait for a worker forever, without a word.
- **Thread accounting**: the experiments run on the thread of the slot's holder task
  (:func:`hold_slot`, a Dask task on the actor's worker), so Dask counts that thread busy and
  ``worker_client()`` secedes from it. A holder with nothing to run for :data:`HOLD_IDLE`
  seconds gives its thread back (the actor's ``run`` then answers ``"unheld"`` and the driver
  submits a new holder before calling again).

What it gives up against ``"tasks"`` (:doc:`experiments`, "How experiments reach the cluster"):
experiments do not appear one by one in Dask's task stream (one holder per slot does), and
their placement is ours (no work stealing).

Examples
--------
A slot actor runs experiments in the order of their numbers (here without Dask, the way a
worker calls it; off a worker it runs them on a thread of its own, where a worker runs them on
its holder task's):

>>> import asyncio
>>> from dask_research.experiments import Hypothesis
>>> async def two():
...     actor = SlotActor(PickledRunner(lambda h: 0.5), bounded=True, objectives=None, timeout=None)
...     second = asyncio.ensure_future(actor.run(1, Hypothesis("h2", "a")))
...     first = await actor.run(0, Hypothesis("h1", "a"))
...     out = [first[0], first[1].reward, (await second)[1].hypothesis.id]
...     await actor.retire()
...     return out
>>> asyncio.run(two())
['done', 0.5, 'h2']
"""
from __future__ import annotations

import asyncio
import logging
import pickle
import queue
import threading
import time
import warnings
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from .._compat import (
    SCHEDULER_LOST,
    actor_call,
    actor_released,
    address_host_port,
    client_status,
    scheduler_workers,
    worker_actor,
    worker_closing,
)
from ..events import Outbox
from .backends import ClusterCancelled, ClusterSideJobs, PickledRunner
from .execute import execute_sync
from .types import ExperimentResult, Hypothesis, Result

__all__ = ["SlotActor", "ActorBackend", "MOVE_AFTER", "HOLD_IDLE", "hold_slot"]

logger = logging.getLogger(__name__)

#: Seconds a retiring actor has to hand back its queued experiments before the driver moves
#: them anyway (a frozen or unreachable worker; a reachable one answers in milliseconds).
MOVE_AFTER = 2.0
#: Seconds a slot's holder task waits with nothing to run before it gives its thread back to the
#: worker (for the run's paper writers, other tasks); the slot's next experiment submits another.
HOLD_IDLE = 1.0
#: Seconds between two looks for a worker with a thread to spare, while a slot has no actor.
PLACE_POLL = 0.5
#: Finished experiments an actor remembers, for a call repeated after a lost connection.
REMEMBER = 64
#: Seconds a worker whose connection failed must stay in the scheduler's table before the driver
#: takes it for alive (and calls it through the scheduler) rather than lost.
ROUTE_JUDGE = 5.0

Outcome = tuple[Any, "Result | BaseException"]


def _on_loopback(address: str | None) -> bool:
    """Whether a Dask address listens on this machine's loopback (or in this process)."""
    if not address:
        return False
    if address.startswith("inproc://"):
        return True
    try:
        host = address_host_port(address)[0]
    except (ValueError, TypeError):
        return False
    return host in ("localhost", "::1") or host.startswith("127.")


# ----------------------------------------------------------------------------------------------
# the worker's side
# ----------------------------------------------------------------------------------------------
class _Entry:
    """One numbered experiment in an actor: waiting, running, or finished (its answer)."""

    __slots__ = ("h", "answer", "started", "dropped")

    def __init__(self, h: Hypothesis, answer: asyncio.Future) -> None:
        self.h, self.answer = h, answer
        self.started = self.dropped = False


def _settle(future: asyncio.Future, value: Any) -> None:
    if not future.done():
        future.set_result(value)


def hold_slot(actor: Any) -> str:
    """The slot's holder: a Dask task, placed on the actor's worker, whose thread runs the
    actor's experiments (:func:`_thread_main`), so that Dask counts that thread as busy (its
    thread accounting, ``secede`` for ``worker_client()``) while the experiments reach it with no
    scheduler in between. Returns when the actor retires or is released; returns at once if the
    actor is not on this worker (a holder that outlived its actor, or placed elsewhere)."""
    from distributed import get_worker

    # the actor's future as a dependency arrives as Dask's handle of it (its key), on its worker
    instance = worker_actor(get_worker(), getattr(actor, "key", actor))
    if not isinstance(instance, SlotActor):
        return "no actor"
    return _hold(weakref.ref(instance))


def _hold(ref: weakref.ReferenceType) -> str:
    """Run the actor's experiments on this thread unless a holder runs already or the actor has
    ended; how it ended: ``"idle"`` (after :data:`HOLD_IDLE` s with nothing to run), ``"retired"``,
    ``"gone"``, or the state that kept it from starting."""
    actor = ref()
    if actor is None:
        return "gone"
    with actor._lock:
        if actor._holding in ("running", "ended"):
            return str(actor._holding)
        actor._holding = "running"
    work = actor._work
    del actor
    return _thread_main(ref, work, HOLD_IDLE)


def _thread_main(ref: weakref.ReferenceType, work: queue.Queue, idle: float | None = None) -> str:
    """The actor's experiment thread (its holder task's, :func:`hold_slot`, on a worker): run
    what the actor hands over, one at a time; as one ends, take the next in number order itself
    (no hop through the event loop), and post each outcome to the actor's event loop. Exits on
    ``None``, when the actor retires, once the actor is gone, or (a holder) after ``idle``
    seconds with nothing to run, giving its thread back to the worker ("idle")."""
    item = None
    while True:
        if item is None:
            try:
                item = work.get(timeout=5.0 if idle is None else idle)
            except queue.Empty:
                actor = ref()
                if actor is None:       # the actor was released without retiring
                    return "gone"
                if idle is not None:
                    with actor._lock:
                        if not actor._busy and work.empty():
                            actor._holding = "none"    # the next run() asks for a holder
                            return "idle"
                del actor
                continue
            if item is None:
                break
        number, h, actor = item[0], item[1], ref()
        if actor is None:
            return "gone"
        if actor._retired:
            # it waited for a thread (a holder that came late) while the actor retired: the
            # driver timed it out or moved it; it never runs here, and a caller still waiting
            # hears "moved" (it goes to the slot's next actor)
            with actor._lock:
                actor._busy = False
                actor._moved.append(number)
            try:
                actor._loop.call_soon_threadsafe(actor._answer_moved, [number])
            except (RuntimeError, AttributeError):
                return "gone"
            break
        runner, bounded, objectives, timeout, loop = (actor._runner, actor._bounded, actor._objectives,
                                                      actor._timeout, actor._loop)
        del actor
        t0 = time.monotonic()
        try:
            out: Any = execute_sync(runner.load(), h, bounded, objectives)
        except BaseException as exc:  # noqa: BLE001 - the runner does not unpickle here, say
            out = ExperimentResult.failure(h, exc, time.monotonic() - t0)
        ran = time.monotonic() - t0
        actor = ref()
        if actor is None:
            return "gone"
        with actor._lock:
            actor._busy = False
            actor._next = number + 1
            moved = []
            if timeout is not None and ran >= timeout:
                # the driver timed it out (or will): it moved, or will move, what waits here
                moved = actor._retire_locked()
            item, more = actor._take_locked()
            moved += more
            retired = actor._retired
        try:
            loop.call_soon_threadsafe(actor._finished, number, out, moved)
        except RuntimeError:            # the loop closed
            return "gone"
        del actor, out, h
        if item is None and retired:
            break
    actor = ref()
    if actor is not None:
        with actor._lock:
            actor._holding = "ended"
        if actor._loop is not None:
            try:
                actor._loop.call_soon_threadsafe(actor._exited.set)
            except (RuntimeError, AttributeError):
                pass
    return "retired"


class SlotActor:
    """One slot's experiments on a worker (a Dask actor): its holder task's thread
    (:func:`hold_slot`) runs them one at a time, in the order of the numbers the driver gave them.

    Its methods are coroutines, so the worker runs them on its event loop (never on its single
    actor thread) and they return at once or when their experiment ends:

    - ``run(number, hypothesis)``: ``("done", Result)`` when experiment ``number`` has run;
      ``("moved", None)`` if the actor retired before starting it; ``("dropped", None)`` if it
      was dropped; ``("unheld", None)`` at once if it must wait and no holder runs (the last one
      gave its thread back): the caller submits one and calls again. A repeated call waits for
      the same experiment.
    - ``drop(number)``: do not start it; ``True`` unless it had started.
    - ``retire()``: start nothing more; every waiting call answers ``"moved"``, and so does
      every call that arrives later; the numbers handed back so far. An experiment that ran
      for ``timeout`` or longer retires the actor too, and so does the release of its future
      (its client went away).
    - ``idle()``: returns once the thread has ended (after ``retire``).

    The state is shared by the worker's event loop (the calls) and the holder's thread (which
    takes the next experiment itself as one ends) under one lock; the answers are set on the
    loop.
    """

    def __init__(self, runner: PickledRunner, bounded: bool, objectives: tuple[str, ...] | None,
                 timeout: float | None) -> None:
        self._runner = runner
        self._bounded = bounded
        self._objectives = objectives
        self._timeout = timeout
        self._lock = threading.Lock()
        self._entries: dict[int, _Entry] = {}
        self._finished_order: deque[int] = deque()
        self._next = 0                    # the number to start next
        self._skip: set[int] = set()      # dropped before they arrived
        self._retired = False
        self._moved: list[int] = []       # numbers handed back (answered "moved")
        self._busy = False
        self._work: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None   # its own thread, off a worker only
        # its holder task's thread (hold_slot): "asked" (the driver submitted one), "running",
        # "none" (the last one gave its thread back after HOLD_IDLE idle seconds), "owed" (a
        # call was answered "unheld": the driver owes a holder), "ended"
        self._holding = "asked"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._exited: asyncio.Event | None = None
        try:                              # created as a Dask task: the worker and the actor's key
            from distributed import get_worker

            self._worker: Any = get_worker()
            self._key: Any = self._worker.get_current_task()
        except ValueError:                # made outside a worker (the docstring's example)
            self._worker, self._key = None, None

    def _begin(self) -> None:
        if self._loop is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._exited = asyncio.Event()
        if self._worker is None:          # off a worker (the example): no holder task comes
            self._holding = "running"
            self._thread = threading.Thread(target=_thread_main, args=(weakref.ref(self), self._work),
                                            name="dask-research-slot-actor", daemon=True)
            self._thread.start()

    # -- under the lock ---------------------------------------------------------------------
    def _take_locked(self) -> tuple[tuple[int, Hypothesis] | None, list[int]]:
        """The next experiment in number order, marked started (``None``: none has arrived, or
        the actor retired), and the numbers handed back if the actor retires here because its
        client released it."""
        if self._busy or self._retired:
            return None, []
        if self._key is not None and (actor_released(self._worker, self._key) or worker_closing(self._worker)):
            # released by its client, or its worker closes (retired, scaled down): start nothing
            # more there, hand back what waits (the driver sends it to the slot's next actor)
            return None, self._retire_locked()
        while True:
            if self._next in self._skip:
                self._skip.discard(self._next)
                self._next += 1
                continue
            entry = self._entries.get(self._next)
            if entry is None:
                return None, []
            if entry.dropped:
                self._next += 1
                continue
            entry.started = self._busy = True
            return (self._next, entry.h), []

    def _retire_locked(self) -> list[int]:
        """Retire: the numbers of the experiments waiting here, handed back."""
        if not self._retired and not self._busy:
            self._work.put(None)          # an idle thread ends now; a busy one after its experiment
        self._retired = True
        moved = [n for n, e in sorted(self._entries.items()) if not e.started and not e.dropped
                 and n not in self._moved]
        self._moved += moved
        return moved

    # -- on the worker's event loop -----------------------------------------------------------
    def _answer_moved(self, numbers: list[int]) -> None:
        for n in numbers:
            entry = self._entries.get(n)
            if entry is not None:
                _settle(entry.answer, ("moved", None))

    def _finished(self, number: int, out: Any, moved: list[int]) -> None:
        entry = self._entries.get(number)
        if entry is not None:
            _settle(entry.answer, ("done", out))
        self._answer_moved(moved)
        self._finished_order.append(number)
        with self._lock:
            while len(self._finished_order) > REMEMBER:
                self._entries.pop(self._finished_order.popleft(), None)

    def _kick(self) -> None:
        """Hand the next experiment to an idle thread."""
        with self._lock:
            item, moved = self._take_locked()
            if item is not None:
                self._work.put(item)
        self._answer_moved(moved)

    async def run(self, number: int, h: Hypothesis | bytes, held: bool = False) -> tuple[str, Any]:
        self._begin()
        with self._lock:
            entry = self._entries.get(number)
            if entry is None:
                hyp: Hypothesis = pickle.loads(h) if isinstance(h, bytes) else h   # pickled once by the driver
                if self._retired:
                    self._moved.append(number)
                    return ("moved", None)
                if number < self._next or number in self._skip:
                    return ("dropped", None)
                entry = self._entries[number] = _Entry(hyp, asyncio.get_running_loop().create_future())
        self._kick()
        with self._lock:
            if self._holding in ("none", "owed") and self._busy and number == self._next:
                if held:                  # the caller submitted the holder it was told to
                    self._holding = "asked"
                else:
                    # this experiment waits and no thread holds the slot: the caller submits a
                    # holder and calls again with held=True (the same number waits for the same
                    # experiment); a call repeated after a lost answer is told again
                    self._holding = "owed"
                    return ("unheld", None)
        return await asyncio.shield(entry.answer)

    async def drop(self, number: int) -> bool:
        with self._lock:
            entry = self._entries.get(number)
            if entry is None:
                if number >= self._next:
                    self._skip.add(number)
            elif entry.started:
                return False
            else:
                entry.dropped = True
        if entry is not None:
            _settle(entry.answer, ("dropped", None))
        self._kick()                      # the one after it may start now
        return True

    async def retire(self) -> list[int]:
        self._begin()
        with self._lock:
            moved = self._retire_locked()
            out = sorted(self._moved)
        self._answer_moved(moved)
        return out

    async def idle(self) -> bool:
        await self.retire()
        assert self._exited is not None
        with self._lock:
            holding = self._holding
            if holding != "running":      # no holder runs: one that starts later ends at once
                self._holding = "ended"
        if holding == "running":
            await self._exited.wait()
        return True


# ----------------------------------------------------------------------------------------------
# the driver's side
# ----------------------------------------------------------------------------------------------
class _Actor:
    """The driver's record of one actor: where it is and the calls sent to it, in order."""

    __slots__ = ("key", "address", "future", "holder", "slot", "numbers", "chain", "retired", "lost",
                 "verdict", "handed_back")

    def __init__(self, key: str, address: str, future: Any, holder: Any, slot: int) -> None:
        self.key, self.address, self.future, self.holder, self.slot = key, address, future, holder, slot
        self.numbers = 0                  # the next call's number
        self.chain: deque[_Call] = deque()   # sent, not yet answered, in number order
        self.retired = False              # no more calls go here
        self.lost = False                 # its worker is gone
        self.verdict: asyncio.Future | None = None   # whether a lost connection lost it
        self.handed_back = False          # retired, and what waited in it was sent elsewhere


class _Call:
    """One experiment in flight: the token the driver holds."""

    __slots__ = ("h", "packed", "slot", "actor", "number", "task", "started", "over", "bounced", "answer",
                 "__weakref__")

    def __init__(self, h: Hypothesis, slot: int) -> None:
        import cloudpickle

        self.h, self.slot = h, slot
        # pickled once, here: a payload that does not pickle fails its dispatch, naming it (as
        # client.submit does for the tasks transport), and a call sent again sends the same bytes
        self.packed: bytes = cloudpickle.dumps(h)
        self.actor: _Actor | None = None
        self.number = -1
        self.task: asyncio.Task | None = None
        self.started = False
        self.over = False                 # answered, cancelled or given up: nothing more to do
        self.bounced = False              # its actor answered "moved"
        self.answer: tuple[Any] | None = None   # its outcome, held until the calls before it return

    def __repr__(self) -> str:
        return f"<experiment {self.h.id!r} slot {self.slot}>"


class _Slot:
    __slots__ = ("actor", "own", "pending", "placing", "moving")

    def __init__(self) -> None:
        self.actor: _Actor | None = None  # where its calls go (its own, or a borrowed one)
        self.own = False
        self.pending: deque[_Call] = deque()   # waiting for an actor, in dispatch order
        self.placing: asyncio.Task | None = None
        self.moving = 0                   # retiring actors still handing back its calls


class ActorBackend(ClusterSideJobs):
    """Experiments in one :class:`SlotActor` per slot, called directly on their workers.

    The same surface as :class:`~.backends.DaskBackend` (``submit``, ``wait``, ``cancel``,
    ``side``, ``ship``, ``close``, ``can_queue``, ``queues_in_cluster``, ``on_start``); it runs
    on the client's event loop. ``reports_starts``: the driver counts every experiment's timeout
    from the ``on_start`` this backend reports, not from its dispatch.
    """

    queues_in_cluster = True
    reports_starts = True

    def __init__(self, client: Any, runner: Callable[[Hypothesis], Any], bounded: bool,
                 topic: str | None, run_id: str, objectives: tuple[str, ...] | None = None,
                 slots: int = 1, timeout: float | None = None) -> None:
        self.client = client
        self.runner = runner
        self.bounded = bounded
        self.objectives = objectives
        self.run_id = run_id
        self.timeout = timeout
        self.on_start: Callable[[Any], None] | None = None
        self._pickled: PickledRunner | None = None
        self._slots = [_Slot() for _ in range(slots)]
        self._actors: list[_Actor] = []
        self._held: dict[str, int] = {}       # address -> this run's actors there (retiring ones too)
        self._ready: list[Outcome] = []
        self._wake: asyncio.Future | None = None
        self._tasks: set[asyncio.Task] = set()
        self._outbox = Outbox(client if topic else None, "experiments", run=run_id, batched=True,
                              topic=topic)
        self._generation = 0
        self._direct: dict[str, bool] = {}   # address -> whether the driver calls it directly
        self._proxied: set[str] = set()       # workers the client could not reach directly
        self._said: set[str] = set()
        self._closed = False
        self._asking: asyncio.Future | None = None
        self._asked = 0.0
        self._live: dict[_Call, None] = {}    # submitted, not yet delivered or given up, in order
        self._connected = client_status(self.client) == "running"   # seen connected (see _stranded)

    # -- the driver's surface -------------------------------------------------------------
    def can_queue(self, slots: int) -> bool:
        """A queued experiment waits in its slot's actor: never more than ``slots`` run."""
        return True

    def poke(self) -> None:
        """Wake :meth:`wait` (a new deadline to honour)."""
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    def submit(self, h: Hypothesis, queued: bool = False, slot: int | None = None) -> _Call:
        if self._pickled is None:
            self._pickled = PickledRunner(self.runner)    # raises here if it does not pickle
        call = _Call(h, 0 if slot is None else slot)
        self._live[call] = None
        st = self._slots[call.slot]
        st.pending.append(call)
        self._pump(call.slot)
        return call

    async def wait(self, timeout: float | None) -> list[Outcome]:
        if not self._ready and self._stranded() is None:
            self._wake = wake = asyncio.get_running_loop().create_future()
            try:
                await asyncio.wait({wake}, timeout=timeout)
            finally:
                self._wake = None
                wake.cancel()
        out, self._ready = self._ready, []
        status = self._stranded()
        if status is not None:          # after what came back before (it ran: it counts)
            out += self._give_up_all(status)
        return out

    # -- a lost scheduler -----------------------------------------------------------------
    def _stranded(self) -> str | None:
        """The client's status if it lost its scheduler during this run (it was seen
        ``"running"`` and is not now: ``"connecting"`` while Dask tries to reconnect, then
        ``"closed"``); ``None`` while it is connected."""
        status = client_status(self.client)
        if status == "running":
            self._connected = True
            return None
        return status if self._connected else None

    async def _connected_again(self, call: _Call) -> bool:
        """``True`` at once while the client is connected; with its scheduler lost, ``False``
        once :meth:`wait` has given ``call`` up (this task is cancelled then), or ``True`` if
        the client reconnects first (the call's actor is then judged as after a lost worker)."""
        if self._stranded() is None:
            return True
        self.poke()
        while self._stranded() is not None and not call.over:
            await asyncio.sleep(PLACE_POLL)
        return not call.over

    def _give_up_all(self, status: str) -> list[Outcome]:
        """Every experiment in flight, given up as cancelled on the cluster: its slot's actor
        went with the scheduler (its worker closes when its own connection to the scheduler
        breaks), and no actor can be placed again. The driver stops the run on the first (see
        :meth:`~.driver.LoopDriver._cancelled_outside`), as it does for the tasks transport."""
        # "connecting": Dask's client cancelled every future, the actors' too, with this reason
        reason = SCHEDULER_LOST if status == "connecting" else f"the client is {status}"
        out: list[Outcome] = []
        for call in list(self._live):
            if call.over:
                continue
            call.over = True
            if call.task is not None and call.task is not asyncio.current_task():
                call.task.cancel()
            st = self._slots[call.slot]
            if call in st.pending:
                st.pending.remove(call)
            if call.actor is not None:
                self._unsend(call, call.actor)
            key = call.actor.key if call.actor is not None else f"slot-{call.slot}"
            out.append((call, ClusterCancelled(key, reason)))
        self._live.clear()
        return out

    async def cancel(self, token: _Call) -> None:
        """Give one experiment up: a waiting one is dropped from its actor; a running one keeps
        its thread there, so its actor retires and the slot moves (see the module)."""
        call = token
        self._live.pop(call, None)
        if call.over:
            return
        call.over = True
        st = self._slots[call.slot]
        if call in st.pending:
            st.pending.remove(call)
            return
        actor = call.actor
        if actor is None:
            return
        if call.task is not None:
            call.task.cancel()
        if call in actor.chain:
            head = actor.chain[0] is call
            actor.chain.remove(call)
            if head and not actor.lost:
                self._retire(actor)
            elif not actor.lost:
                self._spawn(self._drop(actor, call.number))
            self._flush(actor)

    async def release(self) -> None:
        """Nothing more will be sent (the run waits for its paper writers, or closes): retire
        every actor, so that its holder gives its thread back now rather than after
        :data:`HOLD_IDLE` seconds; with as many slots as the cluster has threads, the writers had
        none until then. With the scheduler lost, the workers close too (or the scheduler
        releases the actors of a client that went away): nothing to retire, and a call to a worker
        that is gone would only wait out its connect timeout."""
        retiring = [actor for actor in self._actors if not actor.lost]
        if not retiring or self._stranded() is not None:
            return
        calls = [asyncio.ensure_future(self._call(a, "retire")) for a in retiring]
        await asyncio.wait(calls, timeout=MOVE_AFTER)
        for c in calls:
            c.cancel()

    async def close(self) -> None:
        self._closed = True
        for st in self._slots:
            if st.placing is not None:
                st.placing.cancel()
            st.pending.clear()
        for task in list(self._tasks):
            task.cancel()
        await self.release()
        futures = [f for a in self._actors for f in (a.future, a.holder) if f is not None]
        self._actors.clear()
        if futures:
            try:
                await self.client.cancel(futures, asynchronous=True,
                                         reason="dask-research: the run's slot actors are done")
            except Exception:  # noqa: BLE001 - a lost scheduler: the futures are released anyway
                pass
        await self._drain()

    # -- calls ----------------------------------------------------------------------------
    def _say(self, what: str, text: str) -> None:
        if what not in self._said:
            self._said.add(what)
            warnings.warn(text, stacklevel=3)

    def _spawn(self, coro: Any) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _calls_directly(self, address: str) -> bool:
        """Whether the driver calls the actors on ``address`` straight on their worker: as the
        client's ``direct_to_workers`` says, and where the client leaves it unset (Dask's
        default), when the scheduler and that worker both listen on this machine's loopback (an
        embedded ``LocalCluster``). Otherwise through the scheduler, said once in the log."""
        known = self._direct.get(address)
        if known is None:
            flag = getattr(self.client, "direct_to_workers", None)
            scheduler = getattr(getattr(self.client, "scheduler", None), "address", None)
            known = bool(flag) if flag is not None else (_on_loopback(scheduler) and _on_loopback(address))
            self._direct[address] = known
            if not known:
                logger.info("dask-research: transport='actors' calls the actors on %s through the scheduler "
                            "(about 0.4 ms of its CPU per experiment against 1.6-2.2 ms with "
                            "transport='tasks'); Client(..., direct_to_workers=True) calls them directly "
                            "where the driver can reach the workers", address)
        return known and address not in self._proxied

    async def _call(self, actor: _Actor, method: str, *args: Any) -> Any:
        direct = self._calls_directly(actor.address)
        return await actor_call(self.client, actor.address, actor.key, method, *args, direct=direct)

    def _pump(self, slot: int) -> None:
        """Send the slot's waiting calls to its actor, or find it one."""
        st = self._slots[slot]
        if self._closed:
            return
        actor = st.actor
        if actor is not None and (actor.retired or actor.lost):
            st.actor, actor = None, None
        if not st.pending:
            return
        if (actor is None or not st.own) and st.placing is None:
            st.placing = self._spawn(self._place(slot))
        if actor is None or st.moving:    # (calls handed back go first: keep the order)
            return
        while st.pending:
            self._send(st.pending.popleft(), actor)

    def _send(self, call: _Call, actor: _Actor) -> None:
        call.actor, call.number = actor, actor.numbers
        actor.numbers += 1
        actor.chain.append(call)
        call.started = False
        if actor.chain[0] is call:
            self._started(call)
        call.task = self._spawn(self._run(call, actor))

    def _started(self, call: _Call) -> None:
        if not call.started and not call.over:
            call.started = True
            if self.on_start is not None:
                self.on_start(call)

    async def _run(self, call: _Call, actor: _Actor) -> None:
        held = False                      # a holder was submitted for this call (see SlotActor.run)
        while True:
            try:
                status, value = await self._call(actor, "run", call.number, call.packed, held)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - what the call raised is the outcome
                if not await self._connected_again(call):
                    return                # the scheduler is gone: wait() gave the call up
                if not isinstance(exc, OSError):
                    status, value = "done", exc
                elif await self._lost(actor, exc):
                    return                # _lost moved it
                else:
                    held = False          # (an "unheld" answer may have been the one lost)
                    continue              # the worker lives: the same call again (same number)
            if status == "unheld" and not (call.over or actor.retired):
                self._hold(actor)         # its holder gave the thread back: a new one, same call
                held = True
                continue
            if status == "unheld":        # ... but the actor retired meanwhile: it never ran there
                status = "moved"
            break
        if call.over or call.actor is not actor:
            return
        if status == "done":             # in the actor's order (the answers travel on
            call.answer = (value,)         # connections of their own and may overtake)
            self._flush(actor)
        elif status == "moved":          # the actor retired: the call goes to the slot's next one
            call.bounced = True
            if not actor.retired:         # it retired itself (after an overlong experiment)
                self._retire(actor)
            elif actor.handed_back:       # it arrived there after the hand-back: on its own
                self._unsend(call, actor)
                self._requeue([call])

    def _flush(self, actor: _Actor) -> None:
        """Report the answered calls at the head of ``actor``'s chain, in its order."""
        while actor.chain and actor.chain[0].answer is not None:
            self._deliver(actor.chain.popleft())
        if actor.chain and not actor.retired:
            self._started(actor.chain[0])  # it starts in the actor as the one before returns

    def _deliver(self, call: _Call) -> None:
        assert call.answer is not None
        call.over = True
        self._live.pop(call, None)
        self._ready.append((call, call.answer[0]))
        self.poke()

    def _unsend(self, call: _Call, actor: _Actor) -> None:
        if call in actor.chain:
            actor.chain.remove(call)
        call.actor = None

    def _requeue(self, calls: list[_Call]) -> None:
        """Send ``calls`` again, before their slots' waiting calls, in their order."""
        by_slot: dict[int, list[_Call]] = {}
        for call in calls:
            if not call.over:
                call.started = False
                by_slot.setdefault(call.slot, []).append(call)
        for slot, mine in by_slot.items():
            st = self._slots[slot]
            st.pending.extendleft(reversed(mine))
            self._pump(slot)

    async def _drop(self, actor: _Actor, number: int) -> None:
        try:
            await asyncio.wait_for(self._call(actor, "drop", number), MOVE_AFTER)
        except Exception:  # noqa: BLE001 - a lost or frozen worker: it never starts it anyway
            pass

    def _retire(self, actor: _Actor) -> None:
        """``actor`` starts nothing more; what waits in it goes to its slots' next actors."""
        if actor.retired:
            return
        actor.retired = True
        for st in self._slots:
            if st.actor is actor:
                st.actor = None
        slots = {call.slot for call in actor.chain}
        for slot in slots:
            self._slots[slot].moving += 1
        self._spawn(self._retiring(actor, slots))

    async def _retiring(self, actor: _Actor, slots: set[int]) -> None:
        try:
            await self._hand_back(actor)
        finally:
            for slot in slots:
                self._slots[slot].moving -= 1
        for slot in range(len(self._slots)):
            self._pump(slot)
        try:                            # its thread still holds the worker's thread until it ends
            await self._call(actor, "idle")
        except Exception:  # noqa: BLE001 - its worker is gone
            pass
        self._forget(actor)

    async def _hand_back(self, actor: _Actor) -> None:
        """Send what waited in a retiring actor to its slots' next actors, in its order: what it
        answers it handed back, or, if it does not answer within :data:`MOVE_AFTER` seconds
        (frozen, unreachable), everything it held."""
        try:
            moved = set(await asyncio.wait_for(self._call(actor, "retire"), MOVE_AFTER))
            answered = True
        except Exception:  # noqa: BLE001 - frozen or unreachable: move them all
            moved, answered = set(), False
        back = [c for c in actor.chain if c.answer is None and (not answered or c.number in moved or c.bounced)]
        for call in back:
            if call.task is not None and not call.task.done():
                call.task.cancel()
            self._unsend(call, actor)
        actor.handed_back = True
        for call in actor.chain:          # one it had started before it heard: it runs there
            self._started(call)
            break
        self._flush(actor)
        self._requeue(back)

    def _forget(self, actor: _Actor) -> None:
        if actor in self._actors:
            self._actors.remove(actor)
            self._held[actor.address] = self._held.get(actor.address, 1) - 1
            self._spawn(self._release(actor))
        for slot in range(len(self._slots)):
            self._pump(slot)

    async def _release(self, actor: _Actor) -> None:
        try:
            await self.client.cancel([f for f in (actor.future, actor.holder) if f is not None], asynchronous=True,
                                     reason="dask-research: slot actor retired")
        except Exception:  # noqa: BLE001
            pass

    async def _lost(self, actor: _Actor, exc: BaseException) -> bool:
        """A call to ``actor`` lost its connection. ``True`` once its worker is known gone
        (every call it held is then sent again elsewhere); ``False``: it lives, call again."""
        if actor.lost:
            return True
        if actor.verdict is None:
            actor.verdict = asyncio.get_running_loop().create_future()
            self._spawn(self._judge(actor, exc))
        return bool(await asyncio.shield(actor.verdict))

    async def _judge(self, actor: _Actor, exc: BaseException) -> None:
        assert actor.verdict is not None
        gone = False
        t0 = time.monotonic()
        while True:
            if actor.future.status in ("error", "cancelled", "lost"):
                gone = True
                break
            try:
                workers = await scheduler_workers(self.client)
            except Exception:  # noqa: BLE001 - the scheduler is away too: look again
                workers = {actor.address: {}}
            if actor.address not in workers:
                gone = True
                break
            if time.monotonic() - t0 > ROUTE_JUDGE:
                break                   # it lives: the route from here to it failed
            await asyncio.sleep(0.05)
        if not gone and self._calls_directly(actor.address):
            self._proxied.add(actor.address)
            self._say("route", f"transport='actors': the driver could not reach worker {actor.address} "
                      f"directly ({type(exc).__name__}: {exc}); its calls go through the scheduler")
        verdict, actor.verdict = actor.verdict, None
        if gone:
            actor.lost = actor.retired = True
            for call in [c for c in actor.chain if c.answer is not None]:
                actor.chain.remove(call)  # it ran there and returned: it counts
                self._deliver(call)
            lost = list(actor.chain)
            for call in lost:
                if call.task is not None and call.task is not asyncio.current_task():
                    call.task.cancel()
                self._unsend(call, actor)
            if actor in self._actors:
                self._actors.remove(actor)
                self._held[actor.address] = self._held.get(actor.address, 1) - 1
                self._spawn(self._release(actor))   # its holder would wait for that worker forever
            for st in self._slots:
                if st.actor is actor:
                    st.actor = None
            logger.info("dask-research: worker %s of a slot actor is gone; %d experiments go to "
                        "another actor", actor.address, len(lost))
            self._requeue(lost)
            for slot in range(len(self._slots)):
                self._pump(slot)
        verdict.set_result(gone)

    # -- placement ------------------------------------------------------------------------
    def _choose(self, workers: dict[str, dict]) -> str | None:
        best = None
        for address in sorted(workers):
            w = workers[address]
            if w.get("status", "running") not in ("running", None):
                continue
            free = int(w.get("nthreads", 0) or 0) - self._held.get(address, 0)
            if free > 0 and (best is None or free > best[0]):
                best = (free, address)
        return None if best is None else best[1]

    async def _workers(self) -> dict[str, dict]:
        """The scheduler's workers now; placements that look at once share one answer."""
        if self._asking is None or self._asking.done() and time.monotonic() - self._asked > PLACE_POLL / 2:
            self._asked = time.monotonic()
            self._asking = asyncio.ensure_future(scheduler_workers(self.client))
        return dict(await asyncio.shield(self._asking))

    async def _place(self, slot: int) -> None:
        """Give ``slot`` an actor of its own on a worker with a thread to spare. While there is
        none, the slot shares the live actor with the fewest calls in it (or waits for one),
        and looks again every :data:`PLACE_POLL` seconds."""
        st = self._slots[slot]
        try:
            while not self._closed:
                try:
                    address = self._choose(await self._workers())
                except Exception:  # noqa: BLE001 - the scheduler is away: look again
                    address = None
                if address is not None:
                    actor = await self._create(slot, address)
                    if actor is not None:
                        st.actor, st.own = actor, True
                        return
                    continue
                shared = st.actor
                if shared is None or shared.retired or shared.lost:
                    others = [a for a in self._actors if not (a.retired or a.lost)]
                    if others:
                        st.actor = min(others, key=lambda a: (len(a.chain), a.slot))
                        st.own = False
                        self._say("share", f"transport='actors': no worker has a thread to spare for "
                                  f"slot {slot}'s actor ({len(others)} live actors for {len(self._slots)} "
                                  "slots); it shares another slot's actor until one does")
                        self._pump(slot)
                await asyncio.sleep(PLACE_POLL)
        finally:
            st.placing = None
            self._pump(slot)

    async def _create(self, slot: int, address: str) -> _Actor | None:
        from .._compat import wait_futures

        self._generation += 1
        key = f"experiment-actor-{self.run_id}-{slot}-{self._generation}"
        self._held[address] = self._held.get(address, 0) + 1
        fut = self.client.submit(SlotActor, self._pickled, self.bounded, self.objectives, self.timeout,
                                 actor=True, workers=[address], allow_other_workers=False, pure=False,
                                 key=key)
        actor = _Actor(key, address, fut, None, slot)
        self._hold(actor)                 # at once: it starts on the worker as the actor exists
        while fut.status == "pending":
            try:
                await wait_futures([fut], timeout=1.0)
            except TimeoutError:
                try:
                    alive = address in await scheduler_workers(self.client)
                except Exception:  # noqa: BLE001
                    alive = True
                if not alive:
                    break
        if fut.status != "finished":
            self._held[address] -= 1
            try:
                await self.client.cancel([fut, actor.holder], asynchronous=True)
            except Exception:  # noqa: BLE001
                pass
            return None
        self._actors.append(actor)
        return actor

    def _hold(self, actor: _Actor) -> None:
        """Submit the task whose thread runs ``actor``'s experiments (:func:`hold_slot`), on its
        worker, so that Dask counts that thread busy: with the actor (it depends on the actor's
        future, so it starts once the actor exists, with no round trip to the driver between),
        and again after a holder gave its thread back (the slot idled :data:`HOLD_IDLE` s)."""
        self._generation += 1
        key = f"experiment-slot-{self.run_id}-{actor.slot}-{self._generation}"
        actor.holder = self.client.submit(hold_slot, actor.future, workers=[actor.address],
                                          allow_other_workers=False, pure=False, key=key)
