"""Settings given as files: ``DOCKFLOW_<NAME>_FILE=/run/secrets/x`` sets ``<name>`` to the file's
text (trailing whitespace dropped). Secrets (the secret key, a MongoDB URL with its password) then
come from a container's mounted secrets, not from the environment every child process and
`docker inspect` sees."""

from __future__ import annotations

import json
import os
import typing
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo
from pydantic_settings import PydanticBaseSettingsSource

from core.errors import ConfigError

ENV_PREFIX = "DOCKFLOW_"
SUFFIX = "_FILE"


def variable(field_name: str) -> str:
    """The environment variable of a setting: ``DOCKFLOW_<NAME>``."""
    return f"{ENV_PREFIX}{field_name.upper()}"


def decode_text(field: FieldInfo, value: str) -> Any:
    """A setting's text as the environment and files give it: JSON where it parses, and for a
    list setting also the comma-separated form env files hold (``a,b``)."""
    sequence = typing.get_origin(field.annotation) in (tuple, list, set, frozenset)
    try:
        decoded = json.loads(value)
    except ValueError:
        # Text that opens as JSON is meant as JSON: a broken list (`["a",`) is an error, not
        # one odd host name.
        if not sequence or str(value).lstrip().startswith(("[", "{")):
            raise
        decoded = value
    if sequence and not isinstance(decoded, list):
        return [part.strip() for part in str(value).split(",") if part.strip()]
    return decoded


class SettingFilesSource(PydanticBaseSettingsSource):
    """Reads ``DOCKFLOW_<NAME>_FILE`` for every setting; both it and ``DOCKFLOW_<NAME>`` set is a
    configuration error (which one wins would be a guess)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        direct = variable(field_name)
        named = direct + SUFFIX
        path = os.environ.get(named)
        if not path:
            return None, field_name, False
        if os.environ.get(direct) is not None:
            raise ConfigError(f"set {named} or {direct}, not both")
        try:
            text = Path(path).read_text().rstrip()
        except OSError as exc:
            message = f"invalid setting {named}: cannot read {path}: {exc.strerror}"
            raise ConfigError(message) from None
        if not text:
            # An empty secret file (a mount not yet filled) must not mean "no secret".
            raise ConfigError(f"invalid setting {named}: {path} is empty")
        if self.field_is_complex(field):
            try:
                return decode_text(field, text), field_name, True
            except ValueError:
                raise ConfigError(f"invalid setting {named}: {path} is not JSON") from None
        return text, field_name, False

    def __call__(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for field_name, field in self.settings_cls.model_fields.items():
            value, key, _ = self.get_field_value(field, field_name)
            if value is not None:
                values[key] = value
        return values
