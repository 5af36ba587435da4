"""Database URLs as a person writes them (``--db``, ``QUOTA_LEDGER_DB``): split into URLs, and
shown without their passwords, even when they are malformed.

A URL's text is never shown as given: an error about it shows :func:`redact`'s version, and a
message that might hold one goes through :func:`scrub`. The rules are read on the text, not on
SQLAlchemy's parse, because the text that needs hiding is most often the one that does not parse
(a port that is no number, a password with a space or an ``@`` in it)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import unquote

#: what a password is shown as
HIDDEN = "***"

_SCHEME = r"[A-Za-z][A-Za-z0-9+.-]*://"
#: the whitespace between two URLs: a new URL starts with its scheme
_BETWEEN = re.compile(rf"(\s+)(?={_SCHEME})")
#: a URL without ``@``: its scheme and host, then what stands in the port's place
_NO_USERINFO = re.compile(rf"(?P<head>{_SCHEME}[^\s:/?@\[\]]*:)(?P<port>[^/?@]*)")
#: a URL with a password inside a longer text (a driver's message)
_IN_TEXT = re.compile(rf"({_SCHEME}[^\s:/@]*:)[^\s@]*@")


def split(text: str) -> list[str]:
    """The URLs of a setting that may hold several, separated by whitespace before each one's
    scheme. A text that starts with ``sqlite`` is one URL (SQLite takes one, and a file name may
    hold spaces). A space elsewhere stays in its URL, which the parser then refuses whole: split
    at every space, a password with one would be shown in pieces."""
    text = text.strip()
    if not text:
        return []
    if text.lower().startswith("sqlite"):
        return [text]
    return _BETWEEN.split(text)[::2]


def redact(text: str) -> str:
    """``text`` (one URL or several, well-formed or not) with each URL's password replaced by
    ``***``: ``postgresql://u:***@host/db``. The password runs from the first ``:`` after the
    scheme to the last ``@``; a text without both is shown as it is."""
    parts = _BETWEEN.split(text)
    return "".join(part if i % 2 else _redact_one(part) for i, part in enumerate(parts))


def passwords(texts: Iterable[str | None]) -> set[str]:
    """The passwords in ``texts`` (URL settings), as written and percent-decoded, and each of
    their pieces (apart by whitespace or ``@``) of four characters or more: what :func:`scrub`
    hides from a message."""
    found: set[str] = set()
    for text in texts:
        for part in _BETWEEN.split(text or "")[::2]:
            secret = _password(part)
            if not secret:
                continue
            for whole in {secret, unquote(secret)}:
                found.add(whole)
                found.update(word for word in re.split(r"[\s@]+", whole) if len(word) >= 4)
    return found


def scrub(message: str, secrets: Iterable[str] = ()) -> str:
    """``message`` without any of ``secrets`` nor the password of a URL written in it."""
    for secret in sorted(secrets, key=len, reverse=True):
        if secret:
            message = message.replace(secret, HIDDEN)
    return _IN_TEXT.sub(rf"\g<1>{HIDDEN}@", message)


def _split_userinfo(url: str) -> tuple[str, str, str, str] | None:
    """(scheme, user, password, rest after the last ``@``), or None when there is no password."""
    found = re.match(_SCHEME, url)
    scheme = found.group(0) if found else ""
    userinfo, at, rest = url[len(scheme) :].rpartition("@")
    user, colon, password = userinfo.partition(":")
    if not at or not colon:
        return None
    return scheme, user, password, rest


def _redact_one(url: str) -> str:
    parts = _split_userinfo(url)
    if parts is not None:
        scheme, user, _, rest = parts
        return f"{scheme}{user}:{HIDDEN}@{rest}"
    # No password, unless the user left out the host: postgresql://user:secret/db reads as a
    # host and a port, and a port that is no number is hidden too.
    found = _NO_USERINFO.match(url)
    if found is None or found.group("port").isdigit():
        return url
    return f"{found.group('head')}{HIDDEN}{url[found.end() :]}"


def _password(url: str) -> str:
    url = url.strip()
    parts = _split_userinfo(url)
    if parts is not None:
        return parts[2]
    found = _NO_USERINFO.match(url)  # a password in the port's place, hidden as redact hides it
    return found.group("port") if found and not found.group("port").isdigit() else ""
