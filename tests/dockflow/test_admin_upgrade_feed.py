"""Upgrading to per-business message ids is not a rolling upgrade: a process of this release
refuses a database of the earlier layout at start, saying what to do, until the operator has
run `dockflow admin upgrade-feed` (with every earlier process stopped)."""

from __future__ import annotations

from pathlib import Path

from core.settings import Settings
from core.storage import Storage
from tests.support.admin import Admin
from tests.support.factories import feed_of_earlier_release
from tests.support.processes import DockflowProcess, run_dockflow


async def test_a_process_refuses_the_earlier_layout_until_the_operator_upgrades_the_feed(
    storage: Storage, settings: Settings, admin: Admin, tmp_path: Path
):
    await feed_of_earlier_release(storage, {1: "acme", 2: "globex", 3: "acme"})
    api = DockflowProcess("api", settings, tmp_path / "api.log")

    code, _, err = await run_dockflow("api", env=api.env)

    assert code == 2
    assert "has the layout of an earlier dockflow release" in err
    assert "This upgrade is not a rolling one" in err
    assert "stop every dockflow process of earlier releases" in err
    assert "`dockflow admin upgrade-feed`" in err
    marker = await storage.counters.find_one({"_id": "push_messages"})
    assert marker is not None
    assert marker["value"] == 3  # the refusing process changed nothing

    upgraded = await admin("upgrade-feed", "--json")
    again = await admin("upgrade-feed")

    assert upgraded.code == 0, upgraded.err
    assert upgraded.json == {"converted": True, "ids_from": 3}
    assert again.code == 0, again.err
    assert "has per-business message ids already" in again.out
    async with api:  # starts now
        assert api.base_url
