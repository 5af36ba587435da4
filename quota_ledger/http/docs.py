"""``/openapi.json`` and ``/docs`` behind a reader token, like every other endpoint.

Swagger UI's script and style come from an installed package (``fastapi-offline`` ships them),
served under ``/docs/assets/``: the page works without the internet and names no other host.
``/docs?token=...`` signs the browser in as ``/ui?token=`` does (an HTTP-only cookie), so that
the page's own requests (the document, "Try it out") carry the token.
"""

from pathlib import Path
from typing import Annotated, Any

import fastapi_offline
from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from quota_ledger.http.auth import Authenticator
from quota_ledger.service.tokens import Token

ASSETS = "/docs/assets"
#: Swagger UI's dist files, as the package installs them
ASSET_DIR = Path(fastapi_offline.__file__).parent / "static"


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
    def swagger(request: Request, token: Annotated[str | None, Query(max_length=200)] = None) -> HTMLResponse:
        auth.page_token(request, token, "reader", "the API documentation")
        page = get_swagger_ui_html(
            openapi_url="/openapi.json",
            title="quota-ledger API",
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS}/favicon.png",
            # Swagger UI would otherwise ask validator.swagger.io for a badge.
            swagger_ui_parameters={"validatorUrl": None},
        )
        if token is not None:
            page.set_cookie("quota_ledger_token", token, httponly=True, samesite="strict")
        return page

    return router
