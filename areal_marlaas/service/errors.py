"""OpenAI's error envelope, ``{"error": {message, type, param, code}}``, for every
failure the API returns, so the official SDK raises the matching exception class
(``BadRequestError``, ``AuthenticationError``, ``NotFoundError``, ...)."""

from __future__ import annotations

from typing import Any

from areal.utils import logging
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from areal_marlaas.service.store import (
    Conflict,
    InvalidAction,
    LimitExceeded,
    NotFound,
)

logger = logging.getLogger("MARLaaSService")

# The SDK retries 408/409/429/5xx; a quota or a conflict does not clear by itself.
NO_RETRY = {"x-should-retry": "false"}


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message = status, message
        self.type, self.param, self.code = type, param, code
        self.headers = headers or {}


def bad_request(message: str, param: str | None = None, code: str | None = None):
    return APIError(400, message, param=param, code=code)


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(
        status_code=err.status,
        content=error_body(err.message, err.type, err.param, err.code),
        headers=err.headers,
    )


def error_body(
    message: str, type: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


# Body parameters: a missing object named there is a bad request, not a bad URL.
_BODY_PARAMS = {"training_file", "validation_file", "after"}


def from_store_error(e: Exception) -> APIError:
    if isinstance(e, NotFound):
        if e.param in _BODY_PARAMS:
            return APIError(400, str(e), param=e.param, code=f"{e.kind}_not_found")
        return APIError(404, str(e), param=e.param, code=f"{e.kind}_not_found")
    if isinstance(e, LimitExceeded):
        return APIError(
            429,
            str(e),
            type="rate_limit_error",
            param=e.param,
            code="rate_limit_exceeded",
            headers=NO_RETRY,
        )
    if isinstance(e, Conflict):
        return APIError(409, str(e), param=e.param, code=e.code, headers=NO_RETRY)
    if isinstance(e, InvalidAction):
        return APIError(400, str(e), code="invalid_state")
    raise TypeError(f"not a store error: {e!r}")


def _param_of(loc: tuple) -> str | None:
    parts = [str(p) for p in loc if p not in ("query", "path", "body", "header")]
    return ".".join(parts) or None


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_req: Request, e: APIError):
        return error_response(e)

    @app.exception_handler(NotFound)
    @app.exception_handler(LimitExceeded)
    @app.exception_handler(Conflict)
    @app.exception_handler(InvalidAction)
    async def _store_error(_req: Request, e: Exception):
        return error_response(from_store_error(e))

    @app.exception_handler(RequestValidationError)
    async def _validation(_req: Request, e: RequestValidationError):
        # FastAPI's 422 -> OpenAI's 400 naming the parameter.
        first = e.errors()[0] if e.errors() else {}
        param = _param_of(tuple(first.get("loc", ())))
        msg = first.get("msg", "Invalid request")
        text = f"Invalid value for '{param}': {msg}." if param else f"{msg}."
        return error_response(bad_request(text, param=param))

    @app.exception_handler(StarletteHTTPException)
    async def _http(req: Request, e: StarletteHTTPException):
        if e.status_code == 404:
            msg = f"Invalid URL ({req.method} {req.url.path})"
        elif e.status_code == 405:
            msg = f"Method {req.method} is not allowed on {req.url.path}"
        else:
            msg = str(e.detail)
        return error_response(
            APIError(e.status_code, msg, headers=dict(e.headers or {}))
        )

    @app.exception_handler(Exception)
    async def _internal(req: Request, e: Exception):
        logger.error(f"{req.method} {req.url.path} failed: {e!r}", exc_info=True)
        return error_response(
            APIError(
                500,
                "The server had an error while processing your request.",
                type="server_error",
            )
        )
