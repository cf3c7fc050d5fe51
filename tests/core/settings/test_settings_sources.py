"""Settings from the environment as people write them: list settings as JSON or comma-separated
text, every invalid setting named on a line of its own, unknown ``DOCKFLOW_*`` variables told,
and the public base URL following the HTTP listener unless it is given."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from core.errors import ConfigError
from core.settings import load_settings, unknown_variables


@pytest.fixture(autouse=True)
def _no_dockflow_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The suite's own DOCKFLOW_* variables would be mixed into what each test sets."""
    for name in list(os.environ):
        if name.startswith("DOCKFLOW_"):
            monkeypatch.delenv(name)


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("127.0.0.1", ("127.0.0.1",)),
        ("127.0.0.1, ::1,localhost", ("127.0.0.1", "::1", "localhost")),
        ('["127.0.0.1", "::1"]', ("127.0.0.1", "::1")),
        ("", ()),
    ],
)
def test_a_list_setting_is_json_or_comma_separated(
    monkeypatch: pytest.MonkeyPatch, text: str, hosts: tuple[str, ...]
):
    monkeypatch.setenv("DOCKFLOW_WEBHOOK_ALLOW_HOSTS", text)
    assert load_settings().webhook_allow_hosts == hosts


def test_a_number_list_in_comma_form_is_typed(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("DOCKFLOW_WEBHOOK_RETRY_SCHEDULE_S", "0, 5,300")
    monkeypatch.setenv("DOCKFLOW_TRUSTED_PROXIES", "10.0.0.0/8")
    settings = load_settings()
    assert settings.webhook_retry_schedule_s == (0.0, 5.0, 300.0)
    assert settings.trusted_proxies == ("10.0.0.0/8",)


def test_every_invalid_setting_is_one_line_naming_it(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("DOCKFLOW_HTTP_PORT", "eighty")
    monkeypatch.setenv("DOCKFLOW_TRUSTED_PROXIES", "10.0.0.0/8,not-a-network")
    monkeypatch.setenv("DOCKFLOW_WEBHOOK_RETRY_SCHEDULE_S", "0,5,soon")
    with pytest.raises(ConfigError) as raised:
        load_settings()
    lines = sorted(raised.value.detail.splitlines())
    assert len(lines) == 3, lines
    assert lines[0].startswith("invalid setting DOCKFLOW_HTTP_PORT: ")
    assert lines[1].startswith("invalid setting DOCKFLOW_TRUSTED_PROXIES: ")
    assert "'not-a-network' is not an IP address" in lines[1]
    assert lines[2].startswith("invalid setting DOCKFLOW_WEBHOOK_RETRY_SCHEDULE_S (item 3): ")


def test_a_config_file_that_is_not_toml_is_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    config = tmp_path / "dockflow.toml"
    config.write_text("http_port = 8080\nwebhook_allow_hosts = [127.0.0.1]\n")
    monkeypatch.setenv("DOCKFLOW_CONFIG_FILE", str(config))
    with pytest.raises(ConfigError) as raised:
        load_settings()
    [line] = raised.value.detail.splitlines()
    assert line.startswith(f"DOCKFLOW_CONFIG_FILE: {config} is not valid TOML: ")


def test_unknown_variables_are_named_with_the_likely_intended_one():
    warnings = unknown_variables(
        {
            "DOCKFLOW_HTTP_PORTT": "18080",
            "DOCKFLOW_WEBHOOK_ALLOW_HOST": "127.0.0.1",
            "DOCKFLOW_NOTHING_LIKE_IT": "1",
            "DOCKFLOW_HTTP_PORT": "18080",  # a setting
            "DOCKFLOW_CLIENT_ID": "dfc_demo",  # read by the customer commands
            "HTTP_PORTT": "1",  # not ours
        }
    )
    assert warnings == [
        "unknown setting DOCKFLOW_HTTP_PORTT is ignored (did you mean DOCKFLOW_HTTP_PORT?)",
        "unknown setting DOCKFLOW_NOTHING_LIKE_IT is ignored",
        "unknown setting DOCKFLOW_WEBHOOK_ALLOW_HOST is ignored"
        " (did you mean DOCKFLOW_WEBHOOK_ALLOW_HOSTS?)",
    ]


@pytest.mark.parametrize(
    ("env", "url"),
    [
        ({}, "http://localhost:8080"),
        ({"DOCKFLOW_HTTP_PORT": "18080"}, "http://localhost:18080"),
        ({"DOCKFLOW_HTTP_HOST": "127.0.0.1", "DOCKFLOW_HTTP_PORT": "9"}, "http://127.0.0.1:9"),
        ({"DOCKFLOW_HTTP_HOST": "::1", "DOCKFLOW_HTTP_PORT": "9"}, "http://[::1]:9"),
        (
            {"DOCKFLOW_HTTP_PORT": "18080", "DOCKFLOW_PUBLIC_BASE_URL": "https://dock.example/"},
            "https://dock.example",
        ),
    ],
)
def test_the_public_base_url_follows_the_http_listener_unless_given(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], url: str
):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = load_settings()
    assert settings.public_base_url == url
    assert settings.graphql_url == f"{url}/public_graphql"
    assert settings.dashboard_base_url == f"{url}/dashboard"


def test_list_text_that_opens_as_json_must_be_json(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("DOCKFLOW_WEBHOOK_ALLOW_HOSTS", '["127.0.0.1",')
    with pytest.raises(ConfigError) as raised:
        load_settings()
    [line] = raised.value.detail.splitlines()
    assert line.startswith("invalid setting DOCKFLOW_WEBHOOK_ALLOW_HOSTS")


def test_an_empty_setting_file_is_an_error_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    secret = tmp_path / "secret_key"
    secret.write_text("\n")
    monkeypatch.setenv("DOCKFLOW_SECRET_KEY_FILE", str(secret))
    with pytest.raises(ConfigError) as raised:
        load_settings()
    assert raised.value.detail == f"invalid setting DOCKFLOW_SECRET_KEY_FILE: {secret} is empty"
