"""Structured outputs: what a request's text must match (params, torch-free) and the grammar
backend that enforces it (grammar, xgrammar)."""
