"""A process whose plane checkpoints into a directory, for the writer tests.

``python checkpoint_writer.py CK START [LEASE_TIMEOUT]``: a plane whose ``action`` field holds the
keys ``START, START + 1, ...`` ingests 10 transitions and checkpoints into ``CK``, printing
``committed <version>`` or ``refused: <message>`` (then exits 3). It then reads commands on
stdin: ``again`` ingests 5 more and checkpoints (``committed <version>`` or ``refused: ...``),
``close`` closes the plane (``closed``), ``exit`` leaves without closing. ``LEASE_TIMEOUT``
replaces :data:`~dask_research.replay.checkpoints.LEASE_TIMEOUT` (seconds).
"""
import sys
import time

import numpy as np

from dask_research.exceptions import CheckpointError
from dask_research.replay import ExperiencePlane, checkpoints


def main() -> int:
    ck, start = sys.argv[1], int(sys.argv[2])
    if len(sys.argv) > 3:
        checkpoints.LEASE_TIMEOUT = float(sys.argv[3])
    plane = ExperiencePlane({"action": ((), "int64")}, capacity=100, seed=0)
    nxt = start

    def checkpoint(n: int) -> bool:
        nonlocal nxt
        plane.ingest({"action": np.arange(nxt, nxt + n)})
        nxt += n
        t0 = time.monotonic()
        try:
            plane.checkpoint(ck)
        except CheckpointError as e:
            print(f"refused: {e}", flush=True)
            return False
        print(f"committed {checkpoints.current(ck).name} after {time.monotonic() - t0:.3f} s", flush=True)
        return True

    if not checkpoint(10):
        return 3
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "again":
            checkpoint(5)
        elif cmd == "close":
            plane.close()
            print("closed", flush=True)
        elif cmd == "exit":
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
