"""A TCP proxy that gives one worker a slow, lossy link, for fault tests on real processes.

A kernel without ``sch_netem`` (this project's CI machines) cannot add latency or loss with
``tc netem``, so the proxy emulates both where the bytes flow: every chunk read from one side
is written to the other ``one_way`` seconds later, in order, and with probability ``loss`` a
chunk is held back a retransmission timeout longer, as a lost TCP segment holds back
everything behind it (head-of-line blocking; Linux retransmits after at least 200 ms, and
after about the round trip plus margin: ``2 * one_way + 0.2`` s here). Bytes are never dropped
or reordered: TCP does not let an application see loss any other way.

A worker is put behind it whole by giving it the proxied scheduler address and advertising a
proxied address of its own (``dask worker tcp://127.0.0.1:SP --listen-address
tcp://127.0.0.1:L --contact-address tcp://127.0.0.1:LP``): the scheduler, the client and the
other workers then reach it only through the proxy, and it reaches them only through it.

Run one per proxied address, as its own process (the test's GIL never paces it)::

    python -m dask_research.testing.latency --listen 40001 --to 127.0.0.1:40000 \\
        --one-way 0.1 --loss 0.05 --seed 1

Examples
--------
The delivery schedule (pure arithmetic): chunks that arrive at 0.0, 0.01 and 0.02 s over a
100 ms one-way link, the second one "lost":

>>> release_times([0.0, 0.01, 0.02], one_way=0.1, lost=[False, True, False])
[0.1, 0.51, 0.51]
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import subprocess
import sys
from collections.abc import Iterator, Sequence
from typing import Any

__all__ = ["release_times", "retransmission_timeout", "latency_proxy", "slow_link_cluster", "main"]

CHUNK = 65536


def retransmission_timeout(one_way: float) -> float:
    """How much longer a lost segment's bytes (and everything behind them) take to arrive:
    the round trip plus Linux's 200 ms floor.

    >>> retransmission_timeout(0.1)
    0.4
    """
    return round(2 * one_way + 0.2, 9)


def release_times(arrivals: Sequence[float], one_way: float, lost: Sequence[bool]) -> list[float]:
    """When each chunk is written on, given when it arrived and whether it was "lost": never
    before the chunk ahead of it (TCP delivers in order)."""
    out: list[float] = []
    last = 0.0
    for t, gone in zip(arrivals, lost):
        last = _release(last, t, one_way, gone)
        out.append(round(last, 9))
    return out


def _release(ahead: float, arrived: float, one_way: float, lost: bool) -> float:
    return max(ahead, arrived + one_way + (retransmission_timeout(one_way) if lost else 0.0))


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, one_way: float, loss: float,
                rng: random.Random) -> None:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def deliver() -> None:
        while True:
            due, data = await queue.get()
            if not data:
                break
            await asyncio.sleep(max(0.0, due - loop.time()))
            writer.write(data)
            await writer.drain()
        with contextlib.suppress(Exception):
            writer.write_eof()

    sender = asyncio.ensure_future(deliver())
    last = 0.0
    try:
        while True:
            data = await reader.read(CHUNK)
            if data:
                last = _release(last, loop.time(), one_way, rng.random() < loss)
            await queue.put((last, data))
            if not data:
                break
        await sender
    except (ConnectionError, OSError):
        sender.cancel()
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def _serve(listen: int, host: str, port: int, one_way: float, loss: float, seed: int) -> None:
    rng = random.Random(seed)

    async def connection(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(host, port)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(_pump(client_r, up_w, one_way, loss, rng), _pump(up_r, client_w, one_way, loss, rng),
                             return_exceptions=True)

    server = await asyncio.start_server(connection, "127.0.0.1", listen)
    print(f"listening on 127.0.0.1:{listen}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m dask_research.testing.latency", description=__doc__.split("\n")[0])
    parser.add_argument("--listen", type=int, required=True, help="port to listen on (127.0.0.1)")
    parser.add_argument("--to", required=True, help="HOST:PORT to forward to")
    parser.add_argument("--one-way", type=float, default=0.1, help="seconds added to each direction")
    parser.add_argument("--loss", type=float, default=0.0, help="probability that a chunk is held back an RTO")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    host, _, port = args.to.rpartition(":")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args.listen, host, int(port), args.one_way, args.loss, args.seed))


@contextlib.contextmanager
def latency_proxy(listen: int, to: str, one_way: float, loss: float = 0.0, seed: int = 0) -> Iterator[subprocess.Popen]:
    """A proxy process on ``127.0.0.1:listen`` forwarding to ``to`` (``HOST:PORT``), started and
    listening when the block begins, killed when it ends."""
    proc = subprocess.Popen([sys.executable, "-m", "dask_research.testing.latency", "--listen", str(listen),
                             "--to", to, "--one-way", str(one_way), "--loss", str(loss), "--seed", str(seed)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("listening"):
            raise RuntimeError(f"the latency proxy on port {listen} did not start (exit {proc.wait(10)})")
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


@contextlib.contextmanager
def slow_link_cluster(where: Any, one_way: float, loss: float = 0.0) -> Iterator[tuple[Any, str]]:
    """A real scheduler and two workers, the second behind a latency proxy on both its addresses
    (the scheduler's, which it dials, and its own, which everyone else dials); yields the
    :class:`~dask_research.testing.processes.ProcessCluster` and the slow worker's address.
    ``where``: the folder for the processes' logs."""
    from .processes import WorkerSpec, free_ports, process_cluster

    sched, sched_proxy, listen, listen_proxy = free_ports(4)
    slow = WorkerSpec(scheduler=f"tcp://127.0.0.1:{sched_proxy}",
                      args=["--listen-address", f"tcp://127.0.0.1:{listen}",
                            "--contact-address", f"tcp://127.0.0.1:{listen_proxy}"])
    with latency_proxy(sched_proxy, f"127.0.0.1:{sched}", one_way, loss, seed=1), \
            latency_proxy(listen_proxy, f"127.0.0.1:{listen}", one_way, loss, seed=2), \
            process_cluster(where, [WorkerSpec(), slow], scheduler_port=sched) as cluster:
        yield cluster, f"tcp://127.0.0.1:{listen_proxy}"


if __name__ == "__main__":
    main()
