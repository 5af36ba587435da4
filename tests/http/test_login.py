"""Signing a browser in to the dashboard: a form that posts the token in its body, never a token in
an address; a hardened session cookie; no sign-in from another site; no silent change of identity;
a sign-out."""

from __future__ import annotations

import asyncio
import re
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from http_support import Service, sign_in

from quota_ledger import QuotaEngine
from quota_ledger.http.app import create_app
from quota_ledger.runtime import tokens
from quota_ledger.runtime.settings import Settings

OWN = {"Sec-Fetch-Site": "same-origin"}


def _nonce(page: httpx.Response) -> str:
    found = re.search(r"name=nonce value='([^']+)'", page.text)
    assert found, page.text[:500]
    return found.group(1)


def _notice(page: httpx.Response) -> str:
    found = re.search(r"<p class=notice id=notice role=alert>([^<]*)</p>", page.text)
    return found.group(1) if found else ""


def test_the_dashboard_without_a_session_is_the_sign_in_form(service: Service) -> None:
    with service.client(None) as browser:
        page = browser.get("/ui", params={"partition": "default", "window": "6h"})
        assert page.status_code == 401
        assert page.headers["content-type"].startswith("text/html")
        assert "<form id=login method=post action='/ui/login'>" in page.text
        assert "<input type=password id=token name=token" in page.text
        # The form leads back to the page asked for.
        assert "name=next value='/ui?partition=default&amp;window=6h'" in page.text
        assert "queue-tree" not in page.text


def test_a_token_in_the_address_signs_nobody_in(service: Service) -> None:
    reader = service.tokens["reader"]
    with service.client(None) as browser:
        page = browser.get("/ui", params={"token": reader, "queue": "root"})
        assert page.status_code == 401
        assert "queue-tree" not in page.text
        assert _notice(page) == "A token in the address is not accepted: paste it here instead."
        assert reader not in page.text  # not echoed into the form's next either
        assert "name=next value='/ui?queue=root'" in page.text
        assert "quota_ledger_token" not in browser.cookies
        docs = browser.get("/docs", params={"token": reader})
        assert docs.status_code == 303
        assert docs.headers["location"] == "/ui/login?next=/docs"
        assert browser.get("/openapi.json").status_code == 401


def test_signing_in_sets_a_hardened_cookie_and_leads_to_the_page(service: Service) -> None:
    with service.client(None) as browser:
        done = sign_in(browser, service.tokens["reader"], "/docs")
        assert done.status_code == 303
        assert done.headers["location"] == "/docs"
        cookie = done.headers["set-cookie"]
        assert cookie.startswith("quota_ledger_token=qlt_")
        for attribute in ("HttpOnly", "SameSite=strict", "Path=/", "Max-Age=28800"):
            assert attribute in cookie, attribute
        assert "Secure" not in cookie  # plain HTTP, no proxy said otherwise
        assert done.headers["cache-control"] == "no-store"
        assert browser.get("/ui", headers=OWN).status_code == 200
        assert browser.get("/docs", headers=OWN).status_code == 200
        stray = browser.get("/docs", params={"token": "qlt_old-link"}, headers=OWN)
        assert stray.status_code == 303
        assert stray.headers["location"] == "/docs"
        assert browser.get("/openapi.json", headers=OWN).status_code == 200


@pytest.mark.parametrize(
    "target",
    [
        "//evil.example/ui",
        "https://evil.example/",
        "/\\evil.example",
        "/ui/login",
        "/v1/config",
        "javascript:x",
    ],
)
def test_a_sign_in_never_leads_elsewhere(service: Service, target: str) -> None:
    with service.client(None) as browser:
        form = browser.get("/ui/login", params={"next": target})
        assert form.status_code == 200
        assert "name=next value='/ui'" in form.text
        done = browser.post(
            "/ui/login",
            data={"token": service.tokens["reader"], "next": target, "nonce": _nonce(form)},
            headers=OWN,
        )
        assert done.status_code == 303
        assert done.headers["location"] == "/ui"


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},  # another port of this host
        {"Origin": "http://127.0.0.1:1"},
        {"Origin": "null", "Sec-Fetch-Site": "same-site"},
    ],
)
def test_a_sign_in_from_another_site_is_refused(service: Service, headers: dict[str, str]) -> None:
    with service.client(None) as browser:
        nonce = _nonce(browser.get("/ui/login"))
        refused = browser.post(
            "/ui/login", data={"token": service.tokens["admin"], "nonce": nonce}, headers=headers
        )
        assert refused.status_code == 403
        assert _notice(refused).startswith("Not signed in: the form was sent from another site")
        assert "quota_ledger_token" not in browser.cookies
        assert browser.get("/ui").status_code == 401


def test_a_sign_in_without_the_forms_nonce_is_refused(service: Service) -> None:
    token = service.tokens["admin"]
    with service.client(None) as browser:
        # A page that posts a form of its own has no nonce of this service's (Origin: null is what
        # any page with Referrer-Policy: no-referrer sends, this service's own too).
        bare = browser.post("/ui/login", data={"token": token}, headers={"Origin": "null"})
        assert bare.status_code == 403
        assert "quota_ledger_token" not in browser.cookies
        browser.get("/ui/login")  # the browser holds a nonce now; a forged form still lacks it
        forged = browser.post(
            "/ui/login", data={"token": token, "nonce": "x" * 32}, headers={"Origin": "null"}
        )
        assert forged.status_code == 403
        assert "quota_ledger_token" not in browser.cookies
        nonce = _nonce(browser.get("/ui/login"))
        done = browser.post("/ui/login", data={"token": token, "nonce": nonce}, headers={"Origin": "null"})
        assert done.status_code == 303


def test_a_wrong_token_or_a_body_that_is_not_a_form_is_answered_with_the_form(service: Service) -> None:
    with service.client(None) as browser:
        nonce = _nonce(browser.get("/ui/login"))
        wrong = browser.post("/ui/login", data={"token": "qlt_nope", "nonce": nonce}, headers=OWN)
        assert wrong.status_code == 401
        assert _notice(wrong) == "Unknown or revoked token."
        for body in ({"json": {"token": service.tokens["reader"]}}, {"content": b"\xff\xfe"}):
            odd = browser.post("/ui/login", headers=OWN, **body)
            assert odd.status_code == 403, odd.text
            assert odd.headers["content-type"].startswith("text/html")
        many = "&".join(f"f{i}=1" for i in range(50))
        crowded = browser.post(
            "/ui/login",
            content=many,
            headers={"Content-Type": "application/x-www-form-urlencoded", **OWN},
        )
        assert crowded.status_code == 403
        assert "quota_ledger_token" not in browser.cookies


def test_signing_in_as_another_token_needs_signing_out_first(service: Service) -> None:
    with service.client(None) as browser:
        assert sign_in(browser, service.tokens["reader"]).status_code == 303
        first = browser.cookies["quota_ledger_token"]
        # The form says who is signed in, and offers no token field.
        shown = browser.get("/ui/login")
        assert "<span class=who id=who>test-reader</span>" in shown.text
        assert "name=token" not in shown.text
        swap = browser.post(
            "/ui/login",
            data={"token": service.tokens["admin"], "nonce": browser.cookies["quota_ledger_login"]},
            headers=OWN,
        )
        assert swap.status_code == 409
        assert _notice(swap) == "Already signed in as test-reader: sign out before signing in as test-admin."
        assert browser.cookies["quota_ledger_token"] == first
        # The same token again is fine (a second tab's form).
        again = browser.post(
            "/ui/login",
            data={"token": service.tokens["reader"], "nonce": browser.cookies["quota_ledger_login"]},
            headers=OWN,
        )
        assert again.status_code == 303


def test_signing_out_clears_the_cookie(service: Service) -> None:
    with service.client(None) as browser:
        assert sign_in(browser, service.tokens["reader"]).status_code == 303
        page = browser.get("/ui", headers=OWN)
        assert "<form id=logout method=post action='/ui/logout'>" in page.text
        assert re.search(r"<span id=who [^>]*>test-reader</span>", page.text)
        out = browser.post("/ui/logout", headers=OWN)
        assert out.status_code == 303
        assert out.headers["location"] == "/ui/login"
        assert 'quota_ledger_token=""' in out.headers["set-cookie"]
        assert "Max-Age=0" in out.headers["set-cookie"]
        assert "quota_ledger_token" not in browser.cookies
        assert browser.get("/ui").status_code == 401
        # then another token may sign in
        assert sign_in(browser, service.tokens["admin"]).status_code == 303


def test_a_sign_out_from_another_site_is_refused(service: Service) -> None:
    with service.client(None) as browser:
        assert sign_in(browser, service.tokens["reader"]).status_code == 303
        refused = browser.post("/ui/logout", headers={"Sec-Fetch-Site": "cross-site"})
        assert refused.status_code == 403
        assert browser.get("/ui", headers=OWN).status_code == 200


def test_a_revoked_token_ends_the_session(service: Service) -> None:
    with service.client(None) as browser:
        assert sign_in(browser, service.tokens["reader"]).status_code == 303
        tokens.revoke(service.engine, "test-reader")
        page = browser.get("/ui", headers=OWN)
        assert page.status_code == 401
        assert _notice(page).startswith("The session has ended")
        assert "quota_ledger_token" not in browser.cookies


def test_the_service_root_leads_to_the_dashboard(service: Service) -> None:
    with service.client(None) as browser:
        home = browser.get("/")
        assert home.status_code == 303
        assert home.headers["location"] == "/ui"


def _over_tls(tmp_path: Path, *, tls_at_proxy: bool) -> dict[str, str]:
    """The headers of a sign-in and of the pages, on a service a browser reaches over HTTPS: its
    own TLS, or (``tls_at_proxy``) a proxy's that passes requests on over plain HTTP."""
    with QuotaEngine.from_url(f"sqlite:///{tmp_path / 'l.db'}") as engine:
        engine.migrate()
        reader = tokens.add(engine, "web", "reader")
        settings = Settings(db="sqlite://", tls_at_proxy=tls_at_proxy, session_max_age=600)  # type: ignore[call-arg]
        app = create_app(engine, settings, sweep=False)

        async def behind_proxy(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
            await app({**scope, "scheme": "http"} if tls_at_proxy else scope, receive, send)

        async def story() -> dict[str, str]:
            transport = httpx.ASGITransport(app=behind_proxy)
            base = "https://ledger.example"
            async with httpx.AsyncClient(transport=transport, base_url=base) as browser:
                form = await browser.get("/ui/login")
                nonce = _nonce(form)
                done = await browser.post(
                    "/ui/login", data={"token": reader, "nonce": nonce}, headers={"Origin": base, **OWN}
                )
                assert done.status_code == 303, done.text
                page = await browser.get("/ui", headers=OWN)
                assert page.status_code == 200
                docs = await browser.get("/docs", headers=OWN)
                assert docs.status_code == 200
                return {
                    "form cookie": form.headers["set-cookie"],
                    "cookie": done.headers["set-cookie"],
                    "page hsts": page.headers.get("strict-transport-security", ""),
                    "docs hsts": docs.headers.get("strict-transport-security", ""),
                }

        return asyncio.run(story())


@pytest.mark.parametrize("tls_at_proxy", [False, True])
def test_over_tls_the_cookie_is_secure_and_host_only(tmp_path: Path, tls_at_proxy: bool) -> None:
    seen = _over_tls(tmp_path, tls_at_proxy=tls_at_proxy)
    assert seen["cookie"].startswith("__Host-quota_ledger_token=qlt_")
    for attribute in ("Secure", "HttpOnly", "SameSite=strict", "Path=/", "Max-Age=600"):
        assert attribute in seen["cookie"], attribute
    assert "Domain" not in seen["cookie"]
    assert seen["form cookie"].startswith("__Host-quota_ledger_login=")
    assert "Secure" in seen["form cookie"]
    assert seen["page hsts"] == seen["docs hsts"] == "max-age=31536000"


def test_a_cookie_without_the_prefix_does_not_count_over_tls(tmp_path: Path) -> None:
    with QuotaEngine.from_url(f"sqlite:///{tmp_path / 'l.db'}") as engine:
        engine.migrate()
        reader = tokens.add(engine, "web", "reader")
        app = create_app(engine, Settings(db="sqlite://"), sweep=False)  # type: ignore[call-arg]

        async def page() -> int:
            transport = httpx.ASGITransport(app=app)
            # A cookie another page of this host could have set (no __Host- prefix).
            async with httpx.AsyncClient(
                transport=transport, base_url="https://ledger.example", cookies={"quota_ledger_token": reader}
            ) as browser:
                return (await browser.get("/ui")).status_code

        assert asyncio.run(page()) == 401


def test_with_the_database_down_the_pages_answer_503_never_500() -> None:
    # Nothing listens on port 1: every connection attempt fails at once.
    engine = QuotaEngine.from_url("postgresql://nobody@127.0.0.1:1/none")
    engine.driver.max_attempts = 2
    engine.driver.backoff_base = 0.001
    app = create_app(engine, Settings(db="sqlite://"), sweep=False)  # type: ignore[call-arg]

    async def story() -> list[int]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://ledger") as browser:
            form = await browser.get("/ui/login")  # needs no database
            assert form.status_code == 200
            posted = await browser.post(
                "/ui/login", data={"token": "qlt_anything", "nonce": _nonce(form)}, headers=OWN
            )
            browser.cookies.set("quota_ledger_token", "qlt_anything")
            return [
                posted.status_code,
                (await browser.get("/ui", headers=OWN)).status_code,
                (await browser.get("/docs", headers=OWN)).status_code,
                (await browser.post("/ui/logout", headers=OWN)).status_code,
            ]

    try:
        assert asyncio.run(story()) == [503, 503, 503, 303]
    finally:
        engine.close()
