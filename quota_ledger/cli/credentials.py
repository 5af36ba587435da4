"""The bearer token ``--url`` sends, and where it came from.

``--token`` shows the token to every user of the machine (``ps`` lists a process's arguments), so
it may come from a file instead: ``--token-file FILE`` or ``QUOTA_LEDGER_TOKEN_FILE``, the file's
content without surrounding whitespace. The command line wins over the environment; giving both
ways at one level is refused, as is a file that cannot be read or holds no token. No message
quotes the token or the file's content."""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from quota_ledger.model.errors import InvalidRequest

#: what the hint of a missing token names
HOW_TO_GIVE = (
    "give one with --token-file FILE, --token TOKEN or the environment variable QUOTA_LEDGER_TOKEN "
    "(or QUOTA_LEDGER_TOKEN_FILE); `quota-ledger tokens add` makes one"
)
#: a token file longer than this holds something else (a key, a whole configuration...)
MAX_TOKEN_BYTES = 4096


class TokenUnavailable(InvalidRequest):
    """The bearer token for --url cannot be had: its file cannot be read or holds no token, or
    it is given two ways at once."""

    def __init__(self, source: str, reason: str) -> None:
        #: where the token was to come from: ``--token-file /path``, ``QUOTA_LEDGER_TOKEN_FILE``...
        self.source = source
        #: why it cannot be had
        self.reason = reason
        super().__init__(f"no bearer token from {source}: {reason}", field="token")


@dataclass(frozen=True, kw_only=True)
class BearerToken:
    """A token, and where it came from (for the hint of a refused request)."""

    value: str
    #: ``--token``, ``--token-file /path``, ``QUOTA_LEDGER_TOKEN`` or ``QUOTA_LEDGER_TOKEN_FILE=/path``
    source: str


def bearer_token(
    token: str | None, token_file: str | None, environ: Mapping[str, str] | None = None
) -> BearerToken | None:
    """The token of ``--token`` or ``--token-file`` (``token``, ``token_file``), else of the
    environment; None when none is given."""
    env = os.environ if environ is None else environ
    if token and token_file:
        raise TokenUnavailable("--token and --token-file", "give one of them, not both")
    if token:
        return BearerToken(value=_checked(token, "--token"), source="--token")
    if token_file:
        return _from_file(token_file, f"--token-file {token_file}")
    env_token, env_file = env.get("QUOTA_LEDGER_TOKEN"), env.get("QUOTA_LEDGER_TOKEN_FILE")
    if env_token and env_file:
        raise TokenUnavailable(
            "QUOTA_LEDGER_TOKEN and QUOTA_LEDGER_TOKEN_FILE", "both are set: unset one of them"
        )
    if env_token:
        return BearerToken(value=_checked(env_token, "QUOTA_LEDGER_TOKEN"), source="QUOTA_LEDGER_TOKEN")
    if env_file:
        return _from_file(env_file, f"QUOTA_LEDGER_TOKEN_FILE={env_file}")
    return None


def _from_file(name: str, source: str) -> BearerToken:
    path = Path(name).expanduser()
    try:
        with path.open("rb") as handle:  # a directory: IsADirectoryError
            mode = os.fstat(handle.fileno()).st_mode
            content = handle.read(MAX_TOKEN_BYTES + 1)
    except OSError as error:
        raise TokenUnavailable(source, error.strerror or type(error).__name__) from None
    if len(content) > MAX_TOKEN_BYTES:
        raise TokenUnavailable(
            source, f"the file holds more than {MAX_TOKEN_BYTES} bytes: no token is that long"
        )
    try:
        text = content.decode("ascii").strip()
    except UnicodeDecodeError:
        raise TokenUnavailable(source, "the file holds characters a token cannot have") from None
    if not text:
        raise TokenUnavailable(source, "the file is empty")
    found = BearerToken(value=_checked(text, source), source=source)
    if stat.S_IMODE(mode) & 0o077 and stat.S_ISREG(mode):
        print(
            f"warning: the token file {path} can be read by other users (chmod 600 {path})",
            file=sys.stderr,
        )
    return found


def _checked(value: str, source: str) -> str:
    """``value``, refused when it cannot be a token: an HTTP header value, one word of visible
    ASCII (a file with several lines, say)."""
    value = value.strip()
    if not value or any(not ("!" <= char <= "~") for char in value):
        raise TokenUnavailable(source, "it holds whitespace or characters a token cannot have")
    return value
