"""The rule a restore follows to keep what was revoked after its backup (core/auth/revocations.py):
deletions, narrowed scopes and grants made since."""

from __future__ import annotations

from core.auth.revocations import changes_since
from core.storage import Doc


def test_deleted_credentials_and_narrowed_scopes_are_taken_again_and_grants_are_not():
    restored: dict[str, list[Doc]] = {
        "api_clients": [
            {"_id": "dfc_gone", "secret_hash": "h1"},
            {"_id": "dfc_narrowed", "secret_hash": "h2", "facilities": None},
            {"_id": "dfc_widened", "secret_hash": "h3", "facilities": ["dc1"]},
        ],
        "cameras": [{"_id": "cam_gone", "token_hash": "t1", "disabled": True}],
        "operators": [
            {"_id": "gone", "password_hash": "p1", "businesses": None},
            {"_id": "narrowed", "password_hash": "p2", "businesses": ["acme", "globex"]},
        ],
    }
    current: dict[str, list[Doc]] = {
        "api_clients": [
            {"_id": "dfc_narrowed", "secret_hash": "h2", "facilities": ["dc2", "dc1"]},
            {"_id": "dfc_widened", "secret_hash": "h3", "facilities": ["dc1", "dc2"]},
            {"_id": "dfc_created_since", "secret_hash": "h4"},
        ],
        "operators": [{"_id": "narrowed", "password_hash": "p2", "businesses": ["acme"]}],
    }

    steps = changes_since(current, restored)

    assert [step.line for step in steps] == [
        "api_clients dfc_gone: deleted after the backup: disabled",
        "api_clients dfc_narrowed: facilities narrowed after the backup to ['dc1', 'dc2']",
        "operators gone: deleted after the backup",
        "operators narrowed: businesses narrowed after the backup to ['acme']",
    ]
    assert steps[0].set == {"disabled": True}
    assert steps[2].delete
    assert steps[2].end_sessions
    assert steps[3].set == {"businesses": ["acme"]}
