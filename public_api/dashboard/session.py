"""The dashboard's session cookie and CSRF checks. The sessions themselves (storage, expiry,
login throttling) are core's: core/auth/operator_sessions.py.

The cookie is HttpOnly and SameSite=Lax, and Secure when the dashboard is served over https.
"""

from __future__ import annotations

import hmac

from aiohttp import web

from core.settings import Settings

SESSION_COOKIE = "dockflow_session"
# Set before login so the login form carries a CSRF token too (double submit).
LOGIN_CSRF_COOKIE = "dockflow_login_csrf"
CSRF_FIELD = "csrf_token"


def cookie_is_secure(settings: Settings) -> bool:
    return settings.dashboard_base_url.startswith("https://")


def set_cookie(
    response: web.StreamResponse,
    settings: Settings,
    name: str,
    value: str,
    *,
    path: str,
    max_age: int | None = None,
) -> None:
    response.set_cookie(
        name,
        value,
        path=path,
        max_age=max_age,
        httponly=True,
        samesite="Lax",
        secure=cookie_is_secure(settings),
    )


def csrf_matches(expected: str | None, given: object) -> bool:
    return (
        bool(expected)
        and isinstance(given, str)
        and hmac.compare_digest(str(expected).encode(), given.encode())
    )
