"""YuniKorn's user/group usage endpoints: same paths, same JSON field names, same errors.

Errors use YuniKorn's ``YAPIError`` body ``{status_code, message, description}``. Unlike
YuniKorn, whose tracker is global, the ``{partition}`` path segment selects the partition.
"""

import re
from typing import Annotated, Any
from urllib.parse import unquote

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse

from quota_ledger import queues
from quota_ledger.engine import QuotaEngine
from quota_ledger.errors import GroupNotFound, InvalidRequest, UserNotFound
from quota_ledger.http import models
from quota_ledger.http.auth import Authenticator, check_scope
from quota_ledger.tokens import Token

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

    @router.get("/usage/user/{user}", response_model=dict[str, Any])
    def user(partition: str, user: str, token: Annotated[Token, reader]) -> Any:
        """``UserResourceUsageDAOInfo``: userName, groups {app: group}, queues (the usage tree)."""
        found = scoped(token, partition)
        if isinstance(found, JSONResponse):
            return found
        name = unquote(user)
        if not name:
            return yapi_error(400, "Missing parameters")
        if not USER.match(name):
            return yapi_error(400, "Invalid user name")
        try:
            return engine.user_usage(name, partition=found)
        except (UserNotFound, InvalidRequest):
            return yapi_error(404, "User not found")

    @router.get("/usage/groups", response_model=list[dict[str, Any]])
    def groups(partition: str, token: Annotated[Token, reader]) -> Any:
        """``[GroupResourceUsageDAOInfo]``: every tracked or configured group (``*`` included)."""
        found = scoped(token, partition)
        return found if isinstance(found, JSONResponse) else engine.group_usages(partition=found)

    @router.get("/usage/group/{group}", response_model=dict[str, Any])
    def group(partition: str, group: str, token: Annotated[Token, reader]) -> Any:
        """``GroupResourceUsageDAOInfo``: groupName, applications, queues (the usage tree)."""
        found = scoped(token, partition)
        if isinstance(found, JSONResponse):
            return found
        name = unquote(group)
        if not name:
            return yapi_error(400, "Missing parameters")
        if not GROUP.match(name):
            return yapi_error(400, "Invalid group name")
        try:
            return engine.group_usage(name, partition=found)
        except (GroupNotFound, InvalidRequest):
            return yapi_error(404, "Group not found")

    return router
