"""Request bodies of the OpenAI-compatible endpoints, validated by pydantic.

Strict types (``"5"`` is not an integer, ``1`` is not a boolean) and no unknown fields, so a
wrong request gets a 400 that names the field. OpenAI parameters the engine does not implement
are accepted only at their neutral value (``check_supported``), never silently ignored.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from hifc.entrypoints.server.errors import APIError
from hifc.sampling_params import SamplingParams

_INT64 = dict(ge=-(2 ** 63), le=2 ** 63 - 1)
DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


def _is_token_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value)


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class StreamOptions(_Strict):
    include_usage: bool = False


class _GenerationRequest(_Strict):
    """Fields shared by completions and chat completions (OpenAI names plus vLLM extras)."""
    model: str
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # vLLM extra
    n: int | None = None
    seed: int | None = Field(default=None, **_INT64)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None  # vLLM extra
    ignore_eos: bool = False  # vLLM extra
    skip_special_tokens: bool = True  # vLLM extra
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None

    @field_validator("stop", mode="before")
    @classmethod
    def _stop(cls, value: Any) -> Any:
        if value is None or isinstance(value, str):
            return value
        if isinstance(value, list) and all(isinstance(s, str) for s in value):
            return value
        raise ValueError("stop must be a string or a list of strings")

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def check_supported(self) -> None:
        """400 for parameters set to values the engine does not implement."""
        if self.n not in (None, 1):
            raise APIError(400, f"n must be 1: this server returns one completion per request "
                                f"(got n={self.n})", param="n")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) not in (None, 0):
                raise APIError(400, f"{name} is not supported (only 0)", param=name)
        if self.logit_bias:
            raise APIError(400, "logit_bias is not supported", param="logit_bias")
        if self.stream_options is not None and not self.stream:
            raise APIError(400, "stream_options is only allowed with stream=true",
                           param="stream_options")

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        """The engine's parameters; ValueError (-> 400) for out-of-range values."""
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=-1 if self.top_k is None else self.top_k,
            seed=self.seed, stop=self.stop, stop_token_ids=self.stop_token_ids,
            ignore_eos=self.ignore_eos, skip_special_tokens=self.skip_special_tokens)


class CompletionRequest(_GenerationRequest):
    prompt: str | list[int]
    max_tokens: int | None = DEFAULT_COMPLETION_MAX_TOKENS
    echo: bool | None = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt(cls, value: Any) -> Any:
        """A string or token ids, or a list holding exactly one of those."""
        if isinstance(value, str) or _is_token_ids(value):
            return value
        if isinstance(value, list):
            if not value:
                raise ValueError("prompt is empty")
            if all(isinstance(p, str) or _is_token_ids(p) for p in value):
                if len(value) == 1:
                    return value[0]
                raise ValueError(f"batched prompts ({len(value)} prompts) are not supported: "
                                 "send one prompt per request")
        raise ValueError("prompt must be a string, a list of token ids, or a list holding one "
                         "of those")

    def check_supported(self) -> None:
        super().check_supported()
        if self.echo:
            raise APIError(400, "echo is not supported", param="echo")
        if self.logprobs is not None:
            raise APIError(400, "logprobs is not supported", param="logprobs")
        if self.best_of not in (None, 1):
            raise APIError(400, "best_of must be 1", param="best_of")
        if self.suffix:
            raise APIError(400, "suffix is not supported", param="suffix")


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | None = None
    name: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _content(cls, value: Any) -> Any:
        """Text, or a list of text parts (joined by newlines)."""
        if value is None or isinstance(value, str):
            return value
        if isinstance(value, list):
            texts = []
            for part in value:
                if not (isinstance(part, dict) and part.get("type") == "text"
                        and isinstance(part.get("text"), str)):
                    raise ValueError("content parts must be {\"type\": \"text\", \"text\": str}: "
                                     "only text is supported")
                texts.append(part["text"])
            return "\n".join(texts)
        raise ValueError("content must be a string or a list of text parts")


class ChatCompletionRequest(_GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None  # deprecated by OpenAI in favour of max_completion_tokens
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    add_generation_prompt: bool = True  # vLLM extra

    @property
    def requested_max_tokens(self) -> int | None:
        """None: fill what the context leaves after the prompt."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens

    def check_supported(self) -> None:
        super().check_supported()
        if self.logprobs or self.top_logprobs:
            raise APIError(400, "logprobs is not supported", param="logprobs")
        if self.tools:
            raise APIError(400, "tools are not supported", param="tools")
        if self.tool_choice not in (None, "none"):
            raise APIError(400, "tool_choice is not supported", param="tool_choice")
        if self.response_format not in (None, {"type": "text"}):
            raise APIError(400, "response_format other than text is not supported",
                           param="response_format")

    def conversation(self) -> list[dict[str, str]]:
        return [{"role": m.role, "content": m.content or ""} for m in self.messages]
