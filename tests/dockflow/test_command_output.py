"""The customer commands write to the standard streams the process has when they run, not to
those it had when their module was imported: a caller that redirects them (a program embedding
the command, a test running it in its own process after another test imported the module) gets
the output."""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout
from datetime import UTC, datetime

from dockflow.consume import Consumer, Options
from dockflow.customer_client import ClientOptions
from dockflow.listen import Listener


def test_consume_writes_to_the_stdout_it_runs_with():
    options = Options(
        client=ClientOptions("http://127.0.0.1:1", "client", "secret", "audience"),
        business="acme",
        facility=None,
        since=datetime(2026, 1, 1, tzinfo=UTC),
    )
    caught = io.StringIO()
    with redirect_stdout(caught):
        consumer = Consumer(options)
    assert consumer.out is caught


def test_listen_writes_to_the_streams_it_runs_with():
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        listener = Listener(["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"])
    assert (listener.out, listener.err) == (out, err)
