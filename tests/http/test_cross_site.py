"""The dashboard's cookie authorizes safe reads the service's own pages make, and nothing else:
a page on another origin (another port of the same host is same-site, and SameSite does not
stop its form) cannot make the admin's browser change the ledger."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import httpx
from http_support import Service, sign_in


@contextlib.contextmanager
def _signed_in(service: Service) -> Iterator[httpx.Client]:
    """A browser signed in to the dashboard as the admin, and so holding its cookie."""
    with service.client(None) as browser:
        assert sign_in(browser, service.tokens["admin"]).status_code == 303
        assert "quota_ledger_token" in browser.cookies
        yield browser


def test_the_cookie_reads_what_the_dashboard_reads(service: Service) -> None:
    service.engine.set_limits("root.a", {"vcore": 2})
    with _signed_in(service) as browser:
        page_fetch = {"Sec-Fetch-Site": "same-origin"}
        assert browser.get("/v1/queues/root.a/usage", headers=page_fetch).status_code == 200
        assert browser.get("/v1/queues/root.a/usage").status_code == 200  # no fetch metadata: curl
        assert browser.get("/ui", headers={"Sec-Fetch-Site": "none"}).status_code == 200


def test_the_cookie_never_authorizes_a_change(service: Service) -> None:
    service.engine.set_limits("root.a", {"vcore": 2})
    held = service.engine.reserve("root.a", {"vcore": 1})
    with _signed_in(service) as browser:
        own_origin = {"Origin": service.base, "Sec-Fetch-Site": "same-origin"}
        assert browser.post("/v1/audit", params={"fix": "true"}, headers=own_origin).status_code == 401
        rollback = browser.post(
            f"/v1/reservations/{held.id}/rollback", headers={"Origin": "http://evil.example"}
        )
        assert rollback.status_code == 401
        form = browser.post(
            "/v1/reservations",
            data={"queue": "root.a"},
            headers={"Origin": "http://127.0.0.1:1", "Sec-Fetch-Site": "same-site"},
        )
        assert form.status_code == 401
    assert service.engine.get(held.id).state.value == "pending"
    assert service.engine.usage("root.a")["vcore"].reserved == 1000


def test_a_read_another_site_makes_is_refused_with_the_cookie(service: Service) -> None:
    with _signed_in(service) as browser:
        assert browser.get("/v1/queues", headers={"Sec-Fetch-Site": "same-site"}).status_code == 401
        assert browser.get("/v1/queues", headers={"Sec-Fetch-Site": "cross-site"}).status_code == 401
        assert browser.get("/v1/queues", headers={"Origin": "http://127.0.0.1:1"}).status_code == 401


def test_the_authorization_header_still_changes_the_ledger(service: Service) -> None:
    service.engine.set_limits("root.a", {"vcore": 2})
    held = service.engine.reserve("root.a", {"vcore": 1})
    with service.client("admin", Origin="http://elsewhere.example") as api:
        assert api.post(f"/v1/reservations/{held.id}/rollback").status_code == 200
