"""Settings read from the environment: a pydantic model whose fields also come from
``PREFIX<NAME>`` variables and from a settings file of such lines.

Each field's value is, in order of precedence: the keyword argument given, the environment
variable ``env_prefix + name`` (matched ignoring case), the same line in the settings file
(``_env_file``, dotenv syntax, read by python-dotenv; a path that is not a file is skipped), the
default. Values are validated by pydantic as given, strings coerced to the field's type; a bad
one raises :class:`pydantic.ValidationError` naming the field. Variables and keywords that name
no field are ignored.

This is the subset of pydantic-settings' ``BaseSettings`` the ledger used, with its behaviour,
without importing pydantic-settings (some thirty modules: its sources for files, secrets, command
lines and clouds) at the start of every command."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

#: what ``_env_file`` may be: a path, or several (read in order, a later one's lines winning)
EnvFile = str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None


class EnvSettings(BaseModel):
    """A model whose fields default to ``env_prefix``-named variables of the environment and of
    the settings file ``_env_file``; keyword arguments win over both."""

    model_config = ConfigDict(extra="ignore", validate_default=True)

    #: the variables' prefix: field ``db`` of prefix ``QUOTA_LEDGER_`` is ``QUOTA_LEDGER_DB``
    env_prefix: ClassVar[str] = ""

    def __init__(self, *, _env_file: EnvFile = None, **values: Any) -> None:
        super().__init__(**{**self.from_sources(_env_file), **values})

    @classmethod
    def from_sources(cls, env_file: EnvFile = None) -> dict[str, str]:
        """The values the settings file and the environment give, by field name (the
        environment's winning), as the strings found."""
        found = cls._matching(_read_env_files(env_file))
        found.update(cls._matching(os.environ))
        return found

    @classmethod
    def _matching(cls, variables: Mapping[str, str | None]) -> dict[str, str]:
        lowered = _lowered(variables)
        prefix = cls.env_prefix.lower()
        found: dict[str, str] = {}
        for field in cls.model_fields:
            value = lowered.get(prefix + field.lower())
            if value is not None:  # a file's ``NAME`` line without ``=`` sets nothing
                found[field] = value
        return found


def _lowered(variables: Mapping[str, str | None]) -> dict[str, str | None]:
    """Names matched ignoring case: of two differing only in case, the later one counts."""
    return {name.lower(): value for name, value in variables.items()}


def _read_env_files(env_file: EnvFile) -> dict[str, str | None]:
    if env_file is None:
        return {}
    files = [env_file] if isinstance(env_file, str | os.PathLike) else list(env_file)
    variables: dict[str, str | None] = {}
    for each in files:
        path = Path(each).expanduser()
        if path.is_file() or path.is_fifo():
            from dotenv import dotenv_values

            variables.update(_lowered(dotenv_values(path, encoding="utf-8")))
    return variables
