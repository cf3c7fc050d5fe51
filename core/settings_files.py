"""Settings given as files: ``DOCKFLOW_<NAME>_FILE=/run/secrets/x`` sets ``<name>`` to the file's
text (trailing whitespace dropped). Secrets (the secret key, a MongoDB URL with its password) then
come from a container's mounted secrets, not from the environment every child process and
`docker inspect` sees."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from core.errors import ConfigError

PREFIX = "DOCKFLOW_"
SUFFIX = "_FILE"


class SettingFilesSource(PydanticBaseSettingsSource):
    """Reads ``DOCKFLOW_<NAME>_FILE`` for every setting; both it and ``DOCKFLOW_<NAME>`` set is a
    configuration error (which one wins would be a guess)."""

    def __init__(self, settings_cls: type[BaseSettings]) -> None:
        super().__init__(settings_cls)

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        variable = f"{PREFIX}{field_name.upper()}{SUFFIX}"
        path = os.environ.get(variable)
        if not path:
            return None, field_name, False
        if os.environ.get(f"{PREFIX}{field_name.upper()}") is not None:
            raise ConfigError(f"set {variable} or {PREFIX}{field_name.upper()}, not both")
        try:
            return Path(path).read_text().rstrip(), field_name, False
        except OSError as exc:
            message = f"invalid setting {variable}: cannot read {path}: {exc.strerror}"
            raise ConfigError(message) from None

    def __call__(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for field_name, field in self.settings_cls.model_fields.items():
            value, key, _ = self.get_field_value(field, field_name)
            if value is not None:
                values[key] = value
        return values
