"""The FastAPI application: routes, API key check, body size limit."""
from __future__ import annotations

import contextlib
import hmac
import json
from dataclasses import dataclass
from typing import TypeVar

from fastapi import APIRouter, Depends, FastAPI, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from hifc.entrypoints.server.async_engine import AsyncEngine
from hifc.entrypoints.server.cli import DEFAULT_MAX_REQUEST_BYTES
from hifc.entrypoints.server.errors import (APIError, error_body, install_error_handlers,
                                           validation_error)
from hifc.entrypoints.server.metrics import ServerMetrics
from hifc.entrypoints.server.protocol import ChatCompletionRequest, CompletionRequest
from hifc.entrypoints.server.serving import create_chat_completion, create_completion

_Body = TypeVar("_Body", bound=BaseModel)


@dataclass(frozen=True)
class ServerSettings:
    served_model_names: tuple[str, ...]
    api_key: str | None = None
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES


def build_app(engine: AsyncEngine, metrics: ServerMetrics, settings: ServerSettings) -> FastAPI:
    """The app serving ``engine``; the engine thread runs for the app's lifespan."""
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        engine.start()
        try:
            yield
        finally:
            engine.shutdown()

    # redirect_slashes off: "/v1/completions/" is a JSON 404, not a bodiless 307 redirect
    app = FastAPI(title="hifc", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None, redirect_slashes=False)
    app.state.async_engine = engine
    install_error_handlers(app)

    @app.get("/health")
    async def health() -> Response:
        if engine.is_healthy:
            return Response(status_code=200)
        return JSONResponse(error_body(503, "the engine is not running"), status_code=503)

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    app.include_router(_v1_router(engine, settings))
    return app


def _v1_router(engine: AsyncEngine, settings: ServerSettings) -> APIRouter:
    expected_key = settings.api_key.encode() if settings.api_key else None

    async def check_api_key(request: Request) -> None:
        if expected_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        # compare_digest: the time taken does not depend on where the key differs
        if not (scheme.lower() == "bearer"
                and hmac.compare_digest(token.strip().encode(), expected_key)):
            raise APIError(401, "missing or invalid API key: send 'Authorization: Bearer <key>'",
                           code="invalid_api_key")

    router = APIRouter(prefix="/v1", dependencies=[Depends(check_api_key)])

    def model_card(name: str) -> dict:
        return {"id": name, "object": "model", "created": 0, "owned_by": "hifc",
                "root": engine.model_name, "max_model_len": engine.max_model_len,
                "vocab_size": engine.vocab_size}

    def check_model(name: str) -> None:
        if name not in settings.served_model_names:
            raise APIError(404, f"the model {name!r} does not exist; this server serves "
                                f"{', '.join(map(repr, settings.served_model_names))}",
                           param="model", code="model_not_found")

    @router.get("/models")
    async def list_models() -> dict:
        return {"object": "list", "data": [model_card(n) for n in settings.served_model_names]}

    @router.get("/models/{name:path}")
    async def get_model(name: str) -> dict:
        check_model(name)
        return model_card(name)

    @router.post("/completions")
    async def completions(request: Request):
        body = await _parse_body(request, CompletionRequest, settings.max_request_bytes)
        check_model(body.model)
        return await create_completion(engine, body, request)

    @router.post("/chat/completions")
    async def chat_completions(request: Request):
        body = await _parse_body(request, ChatCompletionRequest, settings.max_request_bytes)
        check_model(body.model)
        return await create_chat_completion(engine, body, request)

    return router


async def _parse_body(request: Request, model: type[_Body], limit: int) -> _Body:
    """Read at most ``limit`` bytes (413 past it), parse JSON (400) and validate (400)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise APIError(413, f"request body is {int(declared)} bytes; the limit is {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise APIError(413, f"request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    raw = b"".join(chunks)
    try:
        data = json.loads(raw)
    except RecursionError:
        raise APIError(400, "request body is not valid JSON: nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, integers of 4300+ digits
        raise APIError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise APIError(400, f"request body must be a JSON object, got {type(data).__name__}")
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise validation_error(exc.errors()) from None
