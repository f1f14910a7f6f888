"""What a request's output must match (vLLM's ``StructuredOutputsParams``); torch-free.

Exactly one constraint: a JSON schema (``json``), any JSON object (``json_object``), a regular
expression (``regex``), one of several strings (``choice``) or an EBNF grammar (``grammar``).
The grammar is compiled when the request is added (``hifc.structured.grammar``), so a bad schema
or regex is a ValueError before anything is queued.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

KINDS = ("json", "json_object", "regex", "choice", "grammar")


@dataclass(frozen=True)
class StructuredOutputsParams:
    json: str | dict | None = None  # a JSON schema, as a dict or its JSON text
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None  # EBNF (GBNF) text
    json_object: bool | None = None
    disable_any_whitespace: bool = False  # JSON without free whitespace between tokens

    def __post_init__(self) -> None:
        if self.choice is not None:
            if isinstance(self.choice, str) or not isinstance(self.choice, (list, tuple)) \
                    or not self.choice:
                raise ValueError("choice must be a non-empty list of strings")
            if not all(isinstance(c, str) for c in self.choice):
                raise ValueError("choice must be a list of strings")
            object.__setattr__(self, "choice", tuple(self.choice))
        if self.json is not None:
            object.__setattr__(self, "json", _schema_text(self.json))
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"{name} must be a non-empty string, got {value!r}")
        if self.json_object not in (None, True, False):
            raise ValueError(f"json_object must be true or false, got {self.json_object!r}")
        if not isinstance(self.disable_any_whitespace, bool):
            raise ValueError("disable_any_whitespace must be true or false")
        given = [k for k in KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise ValueError("structured outputs take exactly one of "
                             f"{', '.join(KINDS)}; got {', '.join(given) or 'none'}")

    @property
    def kind(self) -> str:
        return next(k for k in KINDS if getattr(self, k) not in (None, False))

    @property
    def spec(self) -> str:
        """The constraint as text (the schema's JSON, the regex, ...): with ``kind``, the key
        of a compiled grammar."""
        value = getattr(self, self.kind)
        if self.kind == "choice":
            return json.dumps(list(value))
        return "" if self.kind == "json_object" else value


# vLLM's older name for the same parameters (``SamplingParams.guided_decoding``).
GuidedDecodingParams = StructuredOutputsParams


def _schema_text(schema: Any) -> str:
    """A JSON schema as canonical JSON text; ValueError if it is not a JSON object."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as exc:
            raise ValueError(f"json schema is not valid JSON: {exc}") from None
    if not isinstance(schema, dict):
        raise ValueError(f"json schema must be a JSON object, got {type(schema).__name__}")
    try:
        return json.dumps(schema)  # key order kept: it is the order of the generated fields
    except (TypeError, ValueError) as exc:
        raise ValueError(f"json schema cannot be serialized: {exc}") from None
