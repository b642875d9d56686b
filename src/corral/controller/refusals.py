"""What the API refuses and how it says so: one JSON body for every refusal (`Refused`), the HTTP status of
each CorralError, and the OpenAPI description of both. Corral's refusals are its errors, answered by the
app's handler (api.py); the framework's own (a body that is not JSON, no token) take the same shape."""

from __future__ import annotations

from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field

from corral.controller.bodylimit import MAX_REQUEST_BODY
from corral.controller.protocol import MAX_REQUEST_HEAD
from corral.errors import CorralError, ForbiddenError, UnknownClusterError
from corral.state.store import JobNotFoundError


class RequestBody(BaseModel):
    """Every request body: a field the API does not have is refused (a misspelt `overides` must not be
    ignored), and so is a value of the wrong JSON type (`"service": 0` or `"yes"` is not a boolean)."""

    model_config = ConfigDict(extra="forbid", strict=True)


async def known_query_only(request: Request) -> None:
    """Refuse a query parameter the operation does not have, as a body field is (`?limt=5` must not
    quietly give the default 20), and one value given twice where the operation takes one (`?gpu=A100&
    gpu=H100` must not quietly keep the last): 422, in FastAPI's list of fields."""
    route = request.scope.get("route")
    if route is None or not request.query_params:
        return
    declared = _declared_query(route)
    given = request.query_params
    unknown = [{"type": "extra_forbidden", "loc": ("query", name), "msg": "Extra inputs are not permitted",
                "input": given[name]} for name in given if name not in declared]
    repeated = [{"type": "too_long", "loc": ("query", name), "msg": "Give one value, not several",
                 "input": given.getlist(name)} for name in given
                if name in declared and not declared[name] and len(given.getlist(name)) > 1]
    if unknown or repeated:
        raise RequestValidationError(unknown + repeated)


_DECLARED: dict[int, tuple[Any, dict[str, bool]]] = {}  # id(route) -> (route, its query names: repeatable)


def _declared_query(route: Any) -> dict[str, bool]:
    """A route's query parameter names, each with whether it takes several values (a list), worked out at
    its first request with a query."""
    found = _DECLARED.get(id(route))
    if found is None or found[0] is not route:  # another app's route may have had this id
        found = _DECLARED[id(route)] = (route, _query_names(route.dependant))
    return found[1]


def _query_names(dependant: Any) -> dict[str, bool]:
    """The query parameters a route declares, its dependencies' included: name -> takes several values."""
    names = {param.alias: _several(param.field_info.annotation) for param in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return names


def _several(annotation: Any) -> bool:
    """Whether a parameter's type takes several values (`list[str]`, optional or not)."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _several(get_args(annotation)[0])
    if origin in (Union, UnionType):
        return any(_several(arg) for arg in get_args(annotation))
    return (origin or annotation) in (list, set, frozenset, tuple)


def refused_status(exc: CorralError) -> int:
    """The HTTP status of what Corral refuses on purpose (the app's CorralError handler answers it)."""
    from corral.dev import AllocationNotFoundError
    from corral.uploads import UploadNotFoundError

    if isinstance(exc, (JobNotFoundError, UnknownClusterError, AllocationNotFoundError, UploadNotFoundError)):
        return 404
    if isinstance(exc, ForbiddenError):
        return 403
    return 400


class Refusal(BaseModel):
    message: str = Field(description="One line: what is wrong and what to do")
    kind: str = Field(description="Corral's error class, e.g. JobNotFoundError, TaskError")
    exit_code: int = Field(description="The `corral` command's exit code for it (docs/security.md)")


class Refused(BaseModel):
    detail: Refusal


def refusals(*statuses: int, streamed: bool = False) -> dict[int | str, dict[str, object]]:
    """The OpenAPI description of what an operation may refuse; every refusal has the JSON body `Refused`.
    Any operation may answer 413 (a body too large: bodylimit.py) and 431 (a request line and headers too
    long to read: protocol.py).
    `streamed`: for an operation whose answer is a stream, which FastAPI would otherwise say of its
    refusals too (they are JSON, answered before the stream starts)."""
    described = {
        400: "Refused on purpose: a malformed task or body, an impossible request, a Slurm or cluster error",
        401: "No token, or one the server does not know",
        403: "Not this user's to do (another user's, or an admin's only)",
        404: "No such job, cluster, dev allocation or upload (or not this user's)",
        413: f"The request body is over {MAX_REQUEST_BODY // (1024 * 1024)} MiB (files go as uploads): "
             "nothing was done",
        431: f"The request's line and headers are too long to read (over {MAX_REQUEST_HEAD // 1024} KiB): "
             "nothing was done",
    }
    statuses = (*statuses, 413, 431)
    if streamed:
        body = {"application/json": {"schema": {"$ref": "#/components/schemas/Refused"}}}
        return {status: {"description": described[status], "content": body} for status in statuses}
    return {status: {"model": Refused, "description": described[status]} for status in statuses}


REFUSALS = refusals(400, 401, 403, 404)
STREAM_REFUSALS = refusals(400, 401, 403, 404, streamed=True)
