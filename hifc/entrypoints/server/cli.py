"""``hifc serve``: the OpenAI-compatible HTTP server."""
from __future__ import annotations

import argparse
import logging
import os

from hifc.config import add_engine_args, engine_config_from_args
from hifc.entrypoints.server.access import API_KEY_ENV, check_exposure, resolve_api_key

logger = logging.getLogger(__name__)

DEFAULT_MAX_REQUEST_BYTES = 1 << 20


def register(subparsers) -> None:
    p = subparsers.add_parser("serve", help="OpenAI-compatible HTTP server",
                              description="Serve a model over an OpenAI-compatible HTTP API: "
                              "/v1/models, /v1/completions, /v1/chat/completions, /health, "
                              "/metrics (Prometheus).")
    p.add_argument("model_tag", nargs="?", metavar="MODEL",
                   help="model to serve (same as --model)")
    s = p.add_argument_group("server")
    s.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default loopback; elsewhere an API key is required "
                        "unless --allow-unauthenticated)")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on /v1 (visible in "
                                     f"ps: prefer ${API_KEY_ENV} or --api-key-file)")
    s.add_argument("--api-key-file", help="read the API key from the first line of this file")
    s.add_argument("--allow-unauthenticated", action="store_true",
                   help="serve beyond loopback without an API key")
    s.add_argument("--served-model-name", nargs="+",
                   help="model name(s) clients use (default: the alias, or the model's file or "
                        "directory name)")
    s.add_argument("--max-request-bytes", type=int, default=DEFAULT_MAX_REQUEST_BYTES,
                   help="larger request bodies get 413")
    s.add_argument("--chat-template",
                   help="a Jinja chat template (a file, or the template itself) replacing the "
                   "model's")
    s.add_argument("--log-level", default="info",
                   choices=("critical", "error", "warning", "info", "debug"))
    s.add_argument("--access-log", action="store_true", help="log every HTTP request")
    s.add_argument("--engine-process", action=argparse.BooleanOptionalAction, default=True,
                   help="run the engine in a process of its own, so that streaming many "
                   "responses does not hold up its steps (default: on; a tensor-parallel "
                   "engine always runs in the server's process)")
    add_engine_args(p)
    p.set_defaults(func=run)


def read_chat_template(value: str | None) -> str | None:
    """--chat-template: the file's text, or the value itself if it is a template."""
    if value is None:
        return None
    if os.path.isfile(value):
        with open(value, encoding="utf-8") as f:
            return f.read()
    if "{{" in value or "{%" in value:
        return value
    raise ValueError(f"--chat-template: {value!r} is neither a file nor a Jinja template")


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from hifc.engine.gc_heap import frozen_heap
    from hifc.entrypoints.server.app import ServerSettings, build_app
    from hifc.entrypoints.server.async_engine import AsyncEngine
    from hifc.entrypoints.server.metrics import ServerMetrics
    from hifc.entrypoints.server.transport import JSONErrorH11Protocol
    from hifc.parallel.data_parallel import build_engine

    if args.model_tag:
        args.model = args.model_tag
    if args.max_request_bytes < 1:
        raise ValueError("--max-request-bytes must be positive")
    if not 0 <= args.port < 65536:
        raise ValueError(f"--port must be in 0..65535, got {args.port}")
    api_key = resolve_api_key(args.api_key, args.api_key_file, os.environ)
    warning = check_exposure(args.host, api_key, args.allow_unauthenticated)
    if warning:
        logger.warning(warning)
    chat_template = read_chat_template(args.chat_template)
    config = engine_config_from_args(args, usage_context="server")
    engine = build_engine(config, engine_process=args.engine_process)
    # By default clients see the alias or the file / directory name, never the full path.
    names = tuple(args.served_model_name or (engine.model_name,))
    settings = ServerSettings(names, api_key, args.max_request_bytes, chat_template)
    metrics = ServerMetrics(names[0])
    async_engine = AsyncEngine(engine, observer=metrics)
    metrics.export_engine_stats(async_engine.stats)
    app = build_app(async_engine, metrics, settings)
    logger.info("serving %s as %s on http://%s:%d (max_model_len %d)", engine.model_name,
                ", ".join(names), args.host, args.port, engine.limits.max_model_len)
    try:
        with frozen_heap():
            uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level,
                        access_log=args.access_log, timeout_graceful_shutdown=5,
                        http=JSONErrorH11Protocol)
    finally:  # the app's shutdown stops the engine; this, if the app never started
        async_engine.shutdown()
    return 0
