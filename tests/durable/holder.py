"""A process that holds a durable.Lease, for the lease tests: ``python holder.py ROOT NAME TIMEOUT [WAIT]``.

Prints ``held <token>`` once it holds the lease, then keeps it (heartbeating) until it reads a
line on stdin: ``check`` runs ``check_held()`` and prints ``ok`` or ``lost: <message>``;
``release`` releases and exits. A refusal prints ``refused: <message>`` and exits 3.
"""
import sys

from dask_research.durable import Files, Lease
from dask_research.exceptions import StoreError


def main() -> int:
    root, name, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
    wait = None if len(sys.argv) < 5 or sys.argv[4] == "none" else float(sys.argv[4])
    files = Files(root, error=StoreError)
    lease = Lease(files, files.join(name), label="the test's file", timeout=timeout, wait=wait,
                  announce=lambda kind, msg: print(f"{kind}: {msg}", flush=True))
    try:
        lease.acquire()
    except StoreError as e:
        print(f"refused: {e}", flush=True)
        return 3
    print(f"held {lease.token}", flush=True)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "check":
            try:
                lease.check_held()
                print("ok", flush=True)
            except StoreError as e:
                print(f"lost: {e}", flush=True)
        elif cmd == "release":
            lease.release()
            print("released", flush=True)
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
