"""Errors in the OpenAI JSON format: ``{"error": {"message", "type", "param", "code"}}``."""
from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger(__name__)

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                404: "not_found_error", 405: "invalid_request_error",
                413: "invalid_request_error", 503: "service_unavailable_error"}


class APIError(Exception):
    """An error answered to the client with ``status`` and a message that says what to fix."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code


def error_body(status: int, message: str, param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": _ERROR_TYPES.get(status, "server_error"),
                      "param": param, "code": code}}


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(error_body(err.status, err.message, err.param, err.code),
                        status_code=err.status)


def validation_error(errors: list[dict], max_listed: int = 3) -> APIError:
    """400 naming the offending fields, from pydantic's error list."""
    parts, first_param = [], None
    for err in errors[:max_listed]:
        loc = [str(x) for x in err.get("loc", ()) if x not in ("body",)]
        param = ".".join(loc) or None
        first_param = first_param or param
        msg = err.get("msg", "invalid value")
        msg = msg.removeprefix("Value error, ")
        if err.get("type") == "extra_forbidden":
            msg = "unrecognized request argument"
        elif err.get("type") == "missing":
            msg = "field required"
        parts.append(f"{param}: {msg}" if param else msg)
    more = len(errors) - max_listed
    if more > 0:
        parts.append(f"and {more} more error(s)")
    return APIError(400, "; ".join(parts), param=first_param)


def install_error_handlers(app: FastAPI) -> None:
    async def on_api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    async def on_request_validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(validation_error(list(exc.errors())))

    async def on_pydantic_validation(_: Request, exc: ValidationError) -> JSONResponse:
        return error_response(validation_error(exc.errors()))

    async def on_http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else "request failed"
        return JSONResponse(error_body(exc.status_code, message), status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    async def on_unexpected(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("unexpected server error", exc_info=exc)
        return JSONResponse(error_body(500, f"internal server error: {type(exc).__name__}"),
                            status_code=500)

    app.add_exception_handler(APIError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_request_validation)
    app.add_exception_handler(ValidationError, on_pydantic_validation)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected)
