"""``python -m dockflow.embedded.with_parent PROGRAM [ARGS]``: run PROGRAM so that it dies with
its parent (the dockflow process that started it), even when that parent is SIGKILLed.

It asks Linux for SIGTERM on the parent's death (PR_SET_PDEATHSIG, kept across exec) and then
replaces itself with PROGRAM. This replaces a ``preexec_fn``: that runs Python between fork and
exec in a copy of a process that may have other threads (gRPC's), and the database child
crashed at start now and then (SIGSEGV) when it did.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def main() -> None:
    argv = sys.argv[1:]
    if not argv:
        sys.exit("usage: python -m dockflow.embedded.with_parent PROGRAM [ARGS]")
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() == 1:  # the parent died before the request took effect
        sys.exit(1)
    os.execv(argv[0], argv)  # noqa: S606 - the supervisor's fixed argv


if __name__ == "__main__":
    main()
