"""When a webhook delivery is next due, as every writer of a delivery stores it.

Two fields hold the same moment: `next_attempt_at`, the date people read (the delivery log,
the dashboard), and `due_ms`, milliseconds since the epoch, which the retry claim compares.
The claim runs twice a second in every worker; on the embedded server a date comparison reads
every matching document into Python before it sorts (30,000 due retries of a dead endpoint:
about 330 ms a claim, every other tenant's commands waiting behind it), while an integer
comparison is answered from the `(status, due_ms)` index (0.1 ms). MongoDB answers either from
its index.
"""

from __future__ import annotations

from datetime import datetime

from core.storage import Doc


def schedule(moment: datetime | None) -> Doc:
    """The fields saying the delivery is next due at `moment` (None: never again)."""
    return {"next_attempt_at": moment, "due_ms": as_ms(moment)}


def as_ms(moment: datetime | None) -> int | None:
    return None if moment is None else int(moment.timestamp() * 1000)
