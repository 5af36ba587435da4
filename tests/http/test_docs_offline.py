"""``/docs`` works without the internet: Swagger UI comes from an installed package, and
``/docs?token=`` signs the browser in as ``/ui?token=`` does."""

from __future__ import annotations

import re
import shutil
import subprocess

from http_support import Service

from quota_ledger.http.docs import ASSET_DIR


def chromium(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    assert binary, "Debian's chromium is needed for this test (scripts/test installs it as root)"
    return subprocess.run(
        [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


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


def test_docs_token_signs_the_browser_in_like_the_dashboard(service: Service) -> None:
    with service.client(None) as anonymous:
        assert anonymous.get("/docs").status_code == 401
        assert anonymous.get("/docs", params={"token": "qlt_nope"}).status_code == 401
        page = anonymous.get("/docs", params={"token": service.tokens["reader"]})
        assert page.status_code == 200
        cookie = page.headers["set-cookie"]
        assert "quota_ledger_token=" in cookie
        assert "HttpOnly" in cookie
        # the page's own request for the document now carries the token as a cookie
        assert anonymous.get("/openapi.json").json()["info"]["title"] == "quota-ledger"


def test_swagger_ui_renders_the_api_in_chromium_with_no_other_host_reachable(service: Service) -> None:
    url = f"{service.base}/docs?token={service.tokens['reader']}"
    dom = chromium(
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",  # no name resolves: offline
        "--virtual-time-budget=20000",
        "--dump-dom",
        url,
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert 'class="swagger-ui' in dom.stdout
    assert "opblock" in dom.stdout  # the operations were rendered from /openapi.json
    assert "/v1/reservations" in dom.stdout
