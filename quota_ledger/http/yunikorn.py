"""YuniKorn's user/group usage endpoints: same paths, same JSON field names, same errors.

Errors use YuniKorn's ``YAPIError`` body ``{status_code, message, description}``. Unlike
YuniKorn, whose tracker is global, the ``{partition}`` path segment selects the partition.
"""

import re
from collections.abc import Callable
from typing import Annotated, Any
from urllib.parse import unquote

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse

from quota_ledger.engine import QuotaEngine
from quota_ledger.http import models
from quota_ledger.http.auth import Authenticator, check_scope
from quota_ledger.model import queues
from quota_ledger.model.errors import GroupNotFound, InvalidRequest, UserNotFound
from quota_ledger.runtime.tokens import Token

USER = re.compile(r"^[_a-zA-Z][a-zA-Z0-9:#/_.@-]*[$]?$")
GROUP = re.compile(r"^[_a-zA-Z][a-zA-Z0-9:_.-]*$")


def yapi_error(status: int, message: str) -> JSONResponse:
    return JSONResponse(
        {"status_code": status, "message": message, "description": message}, status_code=status
    )


def build(engine: QuotaEngine, auth: Authenticator) -> APIRouter:
    responses: dict[int | str, dict[str, Any]] = {
        400: {"model": models.YAPIError, "description": "missing or invalid name"},
        401: {"model": models.ErrorOut, "description": "no or unknown token"},
        403: {"model": models.ErrorOut, "description": "wrong role or partition"},
        404: {"model": models.YAPIError, "description": "user or group not found"},
        422: {"model": models.ErrorOut, "description": "invalid request"},
        503: {"model": models.ErrorOut, "description": "database unavailable"},
    }
    router = APIRouter(prefix="/ws/v1/partition/{partition}", tags=["yunikorn"], responses=responses)
    reader = Depends(auth.require("reader"))

    def scoped(token: Token, partition: str) -> str | JSONResponse:
        try:
            queues.validate_partition(partition)
        except InvalidRequest:
            return yapi_error(400, "Invalid partition name")
        check_scope(token, partition, None)
        return partition

    @router.get("/usage/users", response_model=list[dict[str, Any]])
    def users(partition: str, token: Annotated[Token, reader]) -> Any:
        """``[UserResourceUsageDAOInfo]``: every tracked or configured user."""
        found = scoped(token, partition)
        return found if isinstance(found, JSONResponse) else engine.user_usages(partition=found)

    def named(
        token: Token,
        partition: str,
        raw: str,
        rule: re.Pattern[str],
        kind: str,
        fetch: Callable[[str, str], dict[str, Any]],
        missing: type[Exception],
    ) -> Any:
        """One user's or group's usage, with YuniKorn's 400/404 answers."""
        found = scoped(token, partition)
        if isinstance(found, JSONResponse):
            return found
        name = unquote(raw)
        if not name:
            return yapi_error(400, "Missing parameters")
        if not rule.match(name):
            return yapi_error(400, f"Invalid {kind} name")
        try:
            return fetch(name, found)
        except (missing, InvalidRequest):
            return yapi_error(404, f"{kind.capitalize()} not found")

    @router.get("/usage/user/{user}", response_model=dict[str, Any])
    def user(partition: str, user: str, token: Annotated[Token, reader]) -> Any:
        """``UserResourceUsageDAOInfo``: userName, groups {app: group}, queues (the usage tree)."""
        return named(
            token, partition, user, USER, "user", lambda n, p: engine.user_usage(n, partition=p), UserNotFound
        )

    @router.get("/usage/groups", response_model=list[dict[str, Any]])
    def groups(partition: str, token: Annotated[Token, reader]) -> Any:
        """``[GroupResourceUsageDAOInfo]``: every tracked or configured group (``*`` included)."""
        found = scoped(token, partition)
        return found if isinstance(found, JSONResponse) else engine.group_usages(partition=found)

    @router.get("/usage/group/{group}", response_model=dict[str, Any])
    def group(partition: str, group: str, token: Annotated[Token, reader]) -> Any:
        """``GroupResourceUsageDAOInfo``: groupName, applications, queues (the usage tree)."""
        return named(
            token,
            partition,
            group,
            GROUP,
            "group",
            lambda n, p: engine.group_usage(n, partition=p),
            GroupNotFound,
        )

    return router
