"""OpenAI-compatible HTTP server (``hifc serve``): the engine in its own thread behind FastAPI."""
from hifc.entrypoints.server.cli import register

__all__ = ["register"]
