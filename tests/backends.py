"""Which database server the suite runs on, so that a test that cannot hold on one says why.

`DOCKFLOW_MONGODB_URL` set: an external server, whatever it is. Otherwise the session starts the
embedded engine `DOCKFLOW_EMBEDDED_ENGINE` names (tests/conftest.py), and so do the `dockflow`
processes the tests start (they inherit the environment).
"""

from __future__ import annotations

import os

import pytest

from core.settings import EmbeddedEngine, Settings

EXTERNAL_URL = os.environ.get("DOCKFLOW_MONGODB_URL") or None
ENGINE: EmbeddedEngine = Settings().embedded_engine
# The backend the session's database runs on: an engine's name, or "external".
BACKEND = "external" if EXTERNAL_URL else ENGINE


def only_on_nx_27017(missing: str) -> pytest.MarkDecorator:
    """Skip unless the session runs on the embedded nx-27017; `missing` names what the other
    backends lack for this test (e.g. "nx-27017 patches": it checks the patches themselves)."""
    return pytest.mark.skipif(BACKEND != "nx-27017", reason=f"{BACKEND}: {missing}")
