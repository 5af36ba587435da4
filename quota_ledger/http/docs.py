"""``/openapi.json`` and ``/docs`` behind a reader token, like every other endpoint."""

from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse

from quota_ledger.http.auth import Authenticator
from quota_ledger.tokens import Token


def build(app: FastAPI, auth: Authenticator) -> APIRouter:
    router = APIRouter(include_in_schema=False)
    reader = Depends(auth.require("reader"))

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
    def swagger(token: Annotated[Token, reader]) -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title="quota-ledger API")

    return router
