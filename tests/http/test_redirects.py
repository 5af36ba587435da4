"""Redirects name a path on this service, never a host the client chose."""

from __future__ import annotations

from http_support import Service


def test_a_trailing_slash_redirect_does_not_reflect_the_host_header(service: Service) -> None:
    with service.client("reader", Host="evil.example") as client:
        answer = client.get("/v1/limits/", follow_redirects=False)
    assert answer.is_redirect
    assert answer.headers["location"] == "/v1/limits"


def test_a_path_that_starts_like_a_host_stays_a_path() -> None:
    from quota_ledger.http.app import _path_of

    assert _path_of(b"http://127.0.0.1:8080//evil.example/x?a=1") == b"/evil.example/x?a=1"
    assert _path_of(b"https://evil.example") == b"/"


def test_the_redirect_still_leads_to_the_resource(service: Service) -> None:
    with service.client("reader") as client:
        assert client.get("/v1/limits/", follow_redirects=True).status_code == 200
