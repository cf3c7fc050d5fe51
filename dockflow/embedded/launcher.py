"""Runs the embedded database server (nx-27017) with fixes for defects of its storage layer.

Started by `dockflow.embedded.supervisor` as ``python -m dockflow.embedded.launcher ARGS`` (ARGS
are nx-27017's). Each fix is a module of `dockflow.embedded.patches`, applied in the order below
(later ones build on earlier ones); each says what it fixes and which test pins it. They replace
private methods of the exact nx-27017 and neosqlite versions pinned in pyproject.toml: an upgrade
must pass tests/core/storage/test_storage_conformance.py and tests/dockflow/embedded first.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from dockflow.embedded.patches import (
    collection_names,
    date_pages,
    date_queries,
    dotted_projection,
    exit_on_signal,
    id_order,
    indexed_equality,
    indexed_in,
    inline_commands,
    insert_copy,
    logical_grouping,
    missing_collections,
    ne_missing,
    transactions,
    update_types,
    write_transactions,
)

PATCHES = (
    insert_copy,
    update_types,
    id_order,  # wraps the SQL translator before date_queries and ne_missing
    indexed_equality,
    indexed_in,  # wraps indexed_equality's where clauses
    date_queries,  # uses indexed_equality's fields
    date_pages,  # likewise; its SQL compares dates as date_queries makes it
    logical_grouping,
    ne_missing,  # after date_queries, which wraps the same translator
    dotted_projection,
    inline_commands,
    collection_names,
    missing_collections,
    write_transactions,  # forgets collection_names' list on a rollback
    transactions,  # wraps inline_commands' asyncio; its commands bypass write_transactions
    exit_on_signal,  # needed once commands run inline (a signal may land in a finalizer)
)


def apply_patches() -> None:
    for patch in PATCHES:
        patch.apply()


def _own_arguments() -> None:
    """Take the launcher's own flags off the command line (the rest are nx-27017's) and the
    address nx-27017 listens on, which `hello` names."""
    parser = argparse.ArgumentParser(add_help=False)
    # Required: the supervisor passes dockflow's settings (embedded_transaction_*_s).
    parser.add_argument("--transaction-idle-s", type=float, required=True)
    parser.add_argument("--transaction-lifetime-s", type=float, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=27017)
    known, rest = parser.parse_known_args(sys.argv[1:])
    for flag, value in (
        ("--transaction-idle-s", known.transaction_idle_s),
        ("--transaction-lifetime-s", known.transaction_lifetime_s),
    ):
        if value <= 0:
            parser.error(f"{flag} must be positive")
    transactions.set_limits(known.transaction_idle_s, known.transaction_lifetime_s)
    transactions.ADDRESS = f"{known.host}:{known.port}"
    sys.argv[1:] = [*rest, "--host", known.host, "--port", str(known.port)]


class _CancelledConnections(logging.Filter):
    """Drops asyncio's report of a connection cancelled at a stop: Python 3.11's streams ask a
    cancelled client task for its exception and log the CancelledError as an unhandled one,
    a traceback per connection open at every stop (3.12 checks for a cancelled task first)."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not isinstance(error, asyncio.CancelledError)


def _quiet_logging() -> None:
    """The server's log (its output, which the supervisor appends to the engine's log file)
    holds warnings and errors an operator can act on, each once with its time."""
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # nx-27017 logs every command at INFO: kept to warnings, the log costs nothing.
    logging.getLogger("nx_27017").setLevel(logging.WARNING)
    # neosqlite warns on every aggregation it answers in Python rather than in SQL (a batched
    # read's `$in`, say): the same result, a line per read that no one can act on.
    logging.getLogger("neosqlite").setLevel(logging.ERROR)
    logging.getLogger("asyncio").addFilter(_CancelledConnections())


def main() -> None:
    _quiet_logging()
    _own_arguments()
    apply_patches()
    from nx_27017.nx_27017 import main as nx_main

    sys.exit(nx_main())


if __name__ == "__main__":
    main()
