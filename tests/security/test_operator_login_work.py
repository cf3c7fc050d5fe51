"""An operator login does the same password work whether the account exists or not, from the
first login a process answers, under each argon2 profile: the first unknown username must not
cost an extra argon2 hash (the dummy hash made at that first check), nor one of other parameters,
either of which tells an attacker the account does not exist.

Run in a fresh interpreter (a real process, as a restarted `dockflow serve` is): any earlier
login in the test process would have made the dummy hash already and hidden the difference."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, get_args

import argon2
import pytest

from core.auth.credentials import PASSWORD_PROFILES, configure_password_work
from core.settings import PasswordProfile, Settings
from core.storage import Storage
from core.tenancy import tenants

SCRIPT = """
import asyncio, json, sys
import argon2
from core.auth.credentials import configure_password_work
from core.storage import Storage
from core.tenancy import tenants

configure_password_work(2, 32, sys.argv[3])
calls = {"hash": 0, "verify": 0, "costs": set()}
real_hash, real_verify = argon2.PasswordHasher.hash, argon2.PasswordHasher.verify

def counted_hash(self, *args, **kwargs):
    calls["hash"] += 1
    return real_hash(self, *args, **kwargs)

def counted_verify(self, hash, password):
    calls["verify"] += 1
    calls["costs"].add(hash.split("$")[3])  # the parameters checked against: m=..,t=..,p=..
    return real_verify(self, hash, password)

async def work_of(storage, username):
    before = dict(calls)
    calls["costs"] = set()
    assert await tenants.authenticate_operator(storage, username, "not-the-password") is None
    return {"hash": calls["hash"] - before["hash"], "verify": calls["verify"] - before["verify"],
            "costs": sorted(calls["costs"])}

async def main():
    storage = await Storage.connect(sys.argv[1], sys.argv[2])
    try:
        await tenants.create_operator(storage, "lead", "correct-horse-battery", businesses=None)
        argon2.PasswordHasher.hash = counted_hash
        argon2.PasswordHasher.verify = counted_verify
        unknown_first = await work_of(storage, "nobody")
        known = await work_of(storage, "lead")
        unknown_later = await work_of(storage, "nobody-else")
    finally:
        await storage.close()
    print(json.dumps({"unknown_first": unknown_first, "known": known,
                      "unknown_later": unknown_later}))

asyncio.run(main())
"""


@pytest.mark.parametrize("profile", get_args(PasswordProfile))
def test_the_first_login_of_an_unknown_operator_does_the_work_of_a_known_one(
    settings: Settings, profile: PasswordProfile
):
    env = {name: value for name, value in os.environ.items() if name != "DOCKFLOW_MONGODB_URL"}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, settings.mongodb_url or "", settings.mongodb_db, profile],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    work = json.loads(done.stdout.strip().splitlines()[-1])
    cost = argon2.extract_parameters(PASSWORD_PROFILES[profile].no_account_hash)
    assert work["known"] == {
        "hash": 0,
        "verify": 1,
        "costs": [f"m={cost.memory_cost},t={cost.time_cost},p={cost.parallelism}"],
    }
    assert work["unknown_later"] == work["known"]
    assert work["unknown_first"] == work["known"], work  # no argon2 hash at the first check


def test_the_hash_an_unknown_account_is_checked_against_has_the_hashers_parameters():
    """Checked against a hash of other parameters, an unknown account would cost a different
    amount of work from a known one (the hashes are written out in core, not made at start).
    Every profile the setting accepts has its parameters and its hash; the default is RFC
    9106's low-memory recommendation."""
    assert set(PASSWORD_PROFILES) == set(get_args(PasswordProfile))
    for profile, (parameters, no_account_hash) in PASSWORD_PROFILES.items():
        hasher = argon2.PasswordHasher.from_parameters(parameters)
        assert not hasher.check_needs_rehash(no_account_hash), profile
    default = Settings.model_fields["password_hash_profile"].default  # the suite sets another
    assert PASSWORD_PROFILES[default].parameters == argon2.profiles.RFC_9106_LOW_MEMORY


async def test_a_password_hashed_under_another_profile_is_hashed_again_at_its_next_login(
    storage: Storage,
):
    """After a change of `password_hash_profile`, an account hashed under the old one would cost
    the old work at every check, telling it apart from unknown names: its next successful login
    hashes it under the current profile. A wrong password changes nothing, and the operator's
    sessions stay (not a new password)."""
    configure_password_work(2, 32, "rfc9106-low-memory")
    try:
        await tenants.create_operator(storage, "lead", "correct-horse-battery", businesses=None)
    finally:
        configure_password_work(2, 32, "owasp-minimum")  # the suite's (tests/conftest.py)
    await storage.operator_sessions.insert_one({"_id": "s1", "username": "lead"})

    def stored_cost(doc: dict[str, Any] | None) -> str:
        assert doc is not None
        return str(doc["password_hash"]).split("$")[3]

    assert await tenants.authenticate_operator(storage, "lead", "wrong-password") is None
    assert stored_cost(await storage.operators.find_one({"_id": "lead"})) == "m=65536,t=3,p=4"

    assert await tenants.authenticate_operator(storage, "lead", "correct-horse-battery")
    assert stored_cost(await storage.operators.find_one({"_id": "lead"})) == "m=19456,t=2,p=1"
    assert await tenants.authenticate_operator(storage, "lead", "correct-horse-battery")
    assert await storage.operator_sessions.count_documents({"username": "lead"}) == 1
