"""Helpers of the store tests: act on a lease as another process (a taker) would."""
from __future__ import annotations

import fcntl
import json
import os
import pathlib

#: Generous bound on any one wait for an event (a busy 2-core machine makes waits longer, never shorter).
BOUND = 120.0


def steal_lease(lease_file: pathlib.Path, **fields) -> dict:
    """Replace a run's lease by another holder's, as a taker does: under ``lease.lock``, the whole file at once."""
    lock = lease_file.with_name("lease.lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        doc = {**json.loads(lease_file.read_text()), "token": "thief", "pid": 1, **fields}
        tmp = lease_file.with_name("lease.json.swap")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, lease_file)
    finally:
        os.close(fd)
    return doc
