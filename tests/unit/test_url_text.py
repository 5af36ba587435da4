"""Database URLs as people write them: split into URLs, and never shown with their passwords,
however malformed."""

from __future__ import annotations

import pytest

from quota_ledger.driver import dialect
from quota_ledger.model import url_text
from quota_ledger.model.errors import InvalidRequest
from quota_ledger.runtime import location

SECRET = "s3cr3tpw"

#: malformed or awkward URLs, each with its password shown as it should be
SHAPES = {
    f"postgresql://u:{SECRET}@host:notaport/x": "postgresql://u:***@host:notaport/x",
    f"postgresql://u:{SECRET} more@127.0.0.1:1/x": "postgresql://u:***@127.0.0.1:1/x",
    f"postgresql://u:{SECRET}@[::1/x": "postgresql://u:***@[::1/x",
    f"postgresql://u:p@{SECRET}@127.0.0.1:1/x": "postgresql://u:***@127.0.0.1:1/x",
    f"postgresql://u:{SECRET}?x@h/db": "postgresql://u:***@h/db",
    f"postgresql://u:{SECRET}/x": "postgresql://u:***/x",  # no host: the password reads as a port
    f"u:{SECRET}@host/x": "u:***@host/x",  # no scheme
    f"mysql+nodriver://u:{SECRET}@h/x": "mysql+nodriver://u:***@h/x",
}


@pytest.mark.parametrize("text", list(SHAPES))
def test_a_url_is_shown_without_its_password(text: str) -> None:
    assert url_text.redact(text) == SHAPES[text]
    assert SECRET in "".join(url_text.passwords([text]))
    assert SECRET not in url_text.scrub(f"cannot use {text}", url_text.passwords([text]))


def test_several_urls_are_split_before_each_scheme_and_each_is_redacted() -> None:
    text = f" postgresql://u:{SECRET}@db1/x\n\tmysql://v:{SECRET}2@db2/y "
    assert url_text.split(text) == [f"postgresql://u:{SECRET}@db1/x", f"mysql://v:{SECRET}2@db2/y"]
    assert url_text.redact(text.strip()) == "postgresql://u:***@db1/x\n\tmysql://v:***@db2/y"
    assert location.split_urls(text) == url_text.split(text)


def test_a_password_with_a_space_stays_in_its_url() -> None:
    assert url_text.split(f"postgresql://u:pa {SECRET}@h/x") == [f"postgresql://u:pa {SECRET}@h/x"]
    assert url_text.split("sqlite:////home/Jo Doe/ledger.db") == ["sqlite:////home/Jo Doe/ledger.db"]


def test_urls_without_a_password_are_shown_as_they_are() -> None:
    for text in ("postgresql://u@h:5432/x", "sqlite:////tmp/a:b@c.db?mode=ro", "mysql://h/x"):
        assert url_text.passwords([text]) == (set() if "sqlite" not in text else {"b"})
    assert url_text.redact("postgresql://u@h:5432/x") == "postgresql://u@h:5432/x"
    assert url_text.redact("postgresql://h:5432/x") == "postgresql://h:5432/x"


def test_scrub_hides_a_password_written_in_any_message() -> None:
    message = f"driver said: postgresql://someone:{SECRET}@h/x and then {SECRET}"
    assert url_text.scrub(message) == f"driver said: postgresql://someone:***@h/x and then {SECRET}"
    assert SECRET not in url_text.scrub(message, {SECRET})


@pytest.mark.parametrize("text", [text for text in SHAPES if "?" not in text])  # ? is fine in one
def test_the_driver_refuses_a_malformed_url_without_showing_its_password(text: str) -> None:
    if text.startswith("mysql+nodriver"):
        with pytest.raises(InvalidRequest) as raised:
            dialect.build_engine(text)
    else:
        with pytest.raises(InvalidRequest) as raised:
            dialect.parse_url(text)
    assert raised.value.field == "db"
    assert SECRET not in str(raised.value)
    assert raised.value.__cause__ is None or SECRET not in str(raised.value.__cause__)
