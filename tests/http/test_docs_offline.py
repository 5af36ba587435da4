"""``/docs`` works without the internet and under its Content-Security-Policy: Swagger UI comes
from an installed package, and a browser signs in on the dashboard's form and is led back."""

from __future__ import annotations

import re

from browser_support import Browser
from http_support import Service, sign_in

from quota_ledger.http.browser import source_hash
from quota_ledger.http.docs import ASSET_DIR


def test_docs_references_no_other_host_and_its_assets_load(service: Service) -> None:
    with service.client("reader") as reader:
        page = reader.get("/docs")
        assert page.status_code == 200
        html = page.text
        assert "http://" not in html
        assert "https://" not in html
        assert "//" not in html.replace("://", "")
        references = re.findall(r'(?:src|href)="([^"]+)"', html)
        assert len(references) == 3  # the script, the style and the icon
        assert all(ref.startswith("/docs/assets/") for ref in references), references
    with service.client(None) as anonymous:  # the browser fetches them without a header
        for ref in references:
            asset = anonymous.get(ref)
            assert asset.status_code == 200, ref
            assert asset.content == (ASSET_DIR / ref.rsplit("/", 1)[1]).read_bytes()
        assert anonymous.get("/docs/assets/../../pyproject.toml").status_code == 404
        script = next(r for r in references if r.endswith(".js"))
        assert "javascript" in anonymous.get(script).headers["content-type"]


def test_docs_leads_to_the_sign_in_form_and_back(service: Service) -> None:
    with service.client(None) as anonymous:
        to_form = anonymous.get("/docs")
        assert to_form.status_code == 303
        assert to_form.headers["location"] == "/ui/login?next=/docs"
        assert "next value='/docs'" in anonymous.get(to_form.headers["location"]).text
        done = sign_in(anonymous, service.tokens["reader"], "/docs")
        assert done.status_code == 303
        assert done.headers["location"] == "/docs"
        page = anonymous.get("/docs")
        assert page.status_code == 200
        policy = page.headers["content-security-policy"]
        assert "'unsafe-inline'" not in policy
        [start] = re.findall(r"<script>(.*?)</script>", page.text, re.S)
        assert source_hash(start) in policy
        assert page.headers["cache-control"] == "no-store"
        # the page's own request for the document now carries the token as a cookie
        assert anonymous.get("/openapi.json").json()["info"]["title"] == "quota-ledger"


def test_swagger_ui_renders_the_api_in_chromium_with_no_other_host_reachable(service: Service) -> None:
    browser = Browser(1400, 900, "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1")
    try:
        browser.sign_in(service.base, service.tokens["reader"], "/docs")
        assert browser.evaluate("location.pathname") == "/docs"
        assert browser.wait_for("document.querySelectorAll('.opblock').length > 10", 30), browser.dom()[
            -2000:
        ]
        dom = browser.dom()
        assert 'class="swagger-ui' in dom
        assert "/v1/reservations" in dom  # the operations were rendered from /openapi.json
        assert browser.violations() == []
    finally:
        browser.close()
