"""What a restore must not undo: credentials revoked, disabled or re-keyed after the backup.

A restore puts back every document as it was when the backup was taken, credentials too. A key
revoked after a leak, a client disabled or given a new secret, a camera re-keyed, an operator
removed or given a new password would all work again. `changes_since` compares the credentials
of the database a restore replaces (`current`) with those it restored and returns what must be
done again to keep every such step, each with a line an operator can read:

- signing keys: one retired or revoked since is retired or revoked again (its private part
  deleted); one created since (by a rotation) is brought back, so a key still signs;
- API clients and cameras: disabled since, deleted since (then disabled), a new secret or token
  (its hash, and for a client `tokens_not_before`); a client's facilities narrowed since are
  narrowed again (grants made since are not brought back);
- operators: deleted since (deleted again), a new password (its hash; their dashboard sessions
  end), businesses narrowed since.

Nothing else of the restored state changes: what was created after the backup (clients,
cameras, operators, data) stays gone, as a restore means.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError

from core.storage import Doc

# The collections compared; a restore reads them from both databases.
CREDENTIALS: Final = ("signing_keys", "api_clients", "cameras", "operators")


@dataclass(frozen=True)
class Reapply:
    """One step to take again on the restored database, and why."""

    collection: str
    id: str
    reason: str  # e.g. "revoked after the backup"
    set: Doc = field(default_factory=dict)
    unset: tuple[str, ...] = ()
    insert: Doc | None = None  # a document created after the backup, brought back whole
    delete: bool = False
    end_sessions: bool = False  # an operator's dashboard sessions (password changed or deleted)

    @property
    def line(self) -> str:
        return f"{self.collection} {self.id}: {self.reason}"


def _by_id(docs: Iterable[Doc]) -> dict[str, Doc]:
    return {str(doc["_id"]): doc for doc in docs}


def _narrowed(current: Any, restored: Any) -> list[str] | None:
    """The restored scope (facilities, businesses; None = all) cut to what `current` still
    grants, or None when the restored scope grants nothing more than `current`."""
    if current is None:
        return None
    if restored is None:
        return sorted(current)
    kept = sorted(set(restored) & set(current))
    return None if kept == sorted(restored) else kept


def _signing_keys(current: dict[str, Doc], restored: dict[str, Doc]) -> list[Reapply]:
    steps: list[Reapply] = []
    for kid, now in current.items():
        then = restored.get(kid)
        if then is None:
            steps.append(Reapply("signing_keys", kid, "created after the backup", insert=now))
        elif now.get("revoked_at") and not then.get("revoked_at"):
            steps.append(
                Reapply(
                    "signing_keys",
                    kid,
                    "revoked after the backup",
                    set={"revoked_at": now["revoked_at"], "retired_at": now.get("retired_at")},
                    unset=("private_sealed", "private_pem"),
                )
            )
        elif now.get("retired_at") and not then.get("retired_at"):
            retired = {"retired_at": now["retired_at"]}
            steps.append(Reapply("signing_keys", kid, "retired after the backup", set=retired))
    return steps


def _clients_or_cameras(
    collection: str, secret: str, current: dict[str, Doc], restored: dict[str, Doc]
) -> list[Reapply]:
    steps: list[Reapply] = []
    for entity_id, then in restored.items():
        now = current.get(entity_id)
        if now is None:
            if not then.get("disabled"):
                reason = "deleted after the backup: disabled"
                steps.append(Reapply(collection, entity_id, reason, set={"disabled": True}))
            continue
        if now.get("disabled") and not then.get("disabled"):
            reason = "disabled after the backup"
            steps.append(Reapply(collection, entity_id, reason, set={"disabled": True}))
        if now.get(secret) != then.get(secret):
            changed: Doc = {secret: now.get(secret)}
            if "tokens_not_before" in now:
                changed["tokens_not_before"] = now["tokens_not_before"]
            kind = "secret" if collection == "api_clients" else "token"
            reason = f"given a new {kind} after the backup"
            steps.append(Reapply(collection, entity_id, reason, set=changed))
        if collection == "api_clients":
            narrowed = _narrowed(now.get("facilities"), then.get("facilities"))
            if narrowed is not None:
                reason = f"facilities narrowed after the backup to {narrowed}"
                steps.append(Reapply(collection, entity_id, reason, set={"facilities": narrowed}))
    return steps


def _operators(current: dict[str, Doc], restored: dict[str, Doc]) -> list[Reapply]:
    steps: list[Reapply] = []
    for username, then in restored.items():
        now = current.get(username)
        if now is None:
            reason = "deleted after the backup"
            steps.append(Reapply("operators", username, reason, delete=True, end_sessions=True))
            continue
        if now.get("password_hash") != then.get("password_hash"):
            steps.append(
                Reapply(
                    "operators",
                    username,
                    "given a new password after the backup",
                    set={"password_hash": now.get("password_hash")},
                    end_sessions=True,
                )
            )
        narrowed = _narrowed(now.get("businesses"), then.get("businesses"))
        if narrowed is not None:
            reason = f"businesses narrowed after the backup to {narrowed}"
            steps.append(Reapply("operators", username, reason, set={"businesses": narrowed}))
    return steps


def changes_since(current: dict[str, list[Doc]], restored: dict[str, list[Doc]]) -> list[Reapply]:
    """The steps that keep every revocation, disablement and re-keying `current` (the database
    a restore replaced) has and the `restored` one lacks; by collection, then id."""
    now = {name: _by_id(current.get(name, [])) for name in CREDENTIALS}
    then = {name: _by_id(restored.get(name, [])) for name in CREDENTIALS}
    return [
        *_signing_keys(now["signing_keys"], then["signing_keys"]),
        *_clients_or_cameras("api_clients", "secret_hash", now["api_clients"], then["api_clients"]),
        *_clients_or_cameras("cameras", "token_hash", now["cameras"], then["cameras"]),
        *_operators(now["operators"], then["operators"]),
    ]


async def read_credentials(db: AsyncDatabase[Doc]) -> dict[str, list[Doc]]:
    """The credentials `changes_since` compares, as the database `db` holds them."""
    return {name: await db[name].find().to_list() for name in CREDENTIALS}


async def reapply(db: AsyncDatabase[Doc], steps: Iterable[Reapply]) -> None:
    """Take `steps` again on the restored database `db`, in order. A key to bring back that is
    there already (the restore was interrupted and run again) is left as it is."""
    for step in steps:
        collection = db[step.collection]
        if step.insert is not None:
            with contextlib.suppress(DuplicateKeyError):
                await collection.insert_one(step.insert)
        if step.delete:
            await collection.delete_one({"_id": step.id})
        update: dict[str, Any] = {}
        if step.set:
            update["$set"] = step.set
        if step.unset:
            update["$unset"] = dict.fromkeys(step.unset, "")
        if update:
            await collection.update_one({"_id": step.id}, update)
        if step.end_sessions:
            await db["operator_sessions"].delete_many({"username": step.id})
