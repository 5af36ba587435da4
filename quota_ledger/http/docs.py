"""``/openapi.json`` and ``/docs`` behind a reader token, like every other endpoint.

Swagger UI's script and style come from an installed package (``fastapi-offline`` ships them),
served under ``/docs/assets/``: the page works without the internet and names no other host.
A browser signs in on the dashboard's form (``/docs`` without a session leads there and back);
the page's own requests (the document, "Try it out") then carry the session cookie. Its one
inline script, Swagger UI's start, is allowed by its hash in the page's Content-Security-Policy.
"""

import re
from pathlib import Path
from typing import Annotated, Any

import fastapi_offline
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from quota_ledger.http import browser
from quota_ledger.http.auth import Authenticator
from quota_ledger.runtime.tokens import Token

ASSETS = "/docs/assets"
#: Swagger UI's dist files, as the package installs them
ASSET_DIR = Path(fastapi_offline.__file__).parent / "static"
#: the page, the same for everyone
PAGE = bytes(
    get_swagger_ui_html(
        openapi_url="/openapi.json",
        title="quota-ledger API",
        swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
        swagger_css_url=f"{ASSETS}/swagger-ui.css",
        swagger_favicon_url=f"{ASSETS}/favicon.png",
        # Swagger UI would otherwise ask validator.swagger.io for a badge.
        swagger_ui_parameters={"validatorUrl": None},
    ).body
).decode("utf-8")
POLICY = browser.content_security_policy(
    scripts=re.findall(r"<script>(.*?)</script>", PAGE, re.S),
    styles=re.findall(r"<style>(.*?)</style>", PAGE, re.S),
)


def build(app: FastAPI, auth: Authenticator) -> APIRouter:
    router = APIRouter(include_in_schema=False)
    reader = Depends(auth.require("reader"))
    # The assets are Swagger UI's own files, the same for everyone: no token needed.
    app.mount(ASSETS, StaticFiles(directory=ASSET_DIR), name="docs-assets")

    @router.get("/openapi.json")
    def openapi(token: Annotated[Token, reader]) -> JSONResponse:
        document: dict[str, Any] = app.openapi()
        document.setdefault("components", {})["securitySchemes"] = {
            "bearer": {
                "type": "http",
                "scheme": "bearer",
                "description": "quota-ledger tokens add NAME --role ROLE",
            }
        }
        document["security"] = [{"bearer": []}]
        return JSONResponse(document)

    @router.get("/docs")
    def swagger(request: Request) -> Response:
        found = auth.page_token(request)
        if found is None:
            to_login = RedirectResponse("/ui/login?next=/docs", status_code=303)
            return browser.protect(to_login, request, auth.sessions, None)
        if not found.allows("reader"):
            raise HTTPException(403, "the API documentation needs the reader role")
        if "token" in request.query_params:  # never accepted; out of the address bar with it
            return browser.protect(RedirectResponse("/docs", status_code=303), request, auth.sessions, None)
        return browser.protect(HTMLResponse(PAGE), request, auth.sessions, POLICY)

    return router
