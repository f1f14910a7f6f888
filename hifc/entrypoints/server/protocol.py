"""Request bodies of the OpenAI-compatible endpoints, validated by pydantic.

Strict types (``"5"`` is not an integer, ``1`` is not a boolean), so a wrong value gets a 400
that names the field. Fields this server does not know are ignored (the server logs a warning,
as vLLM does); OpenAI parameters it knows but does not implement are accepted only at their
neutral value (``check_supported``).
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from hifc.entrypoints.server.errors import APIError
from hifc.loader.chat import content_text
from hifc.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams

_INT64 = dict(ge=-(2 ** 63), le=2 ** 63 - 1)
DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
MAX_N = 128  # OpenAI's limit on completions per request
MAX_TOP_LOGPROBS = 20  # OpenAI's limit on top_logprobs


def _is_token_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value)


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", populate_by_name=True)


class StreamOptions(_Strict):
    include_usage: bool = False


class JsonSchemaFormat(_Strict):
    name: str | None = None
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class _GenerationRequest(_Strict):
    """Fields shared by completions and chat completions (OpenAI names plus vLLM extras)."""
    model: str
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # vLLM extra
    min_p: float | None = None  # vLLM extra
    n: int = Field(default=1, ge=1, le=MAX_N)
    seed: int | None = Field(default=None, **_INT64)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None  # vLLM extra
    ignore_eos: bool = False  # vLLM extra
    min_tokens: int = 0  # vLLM extra
    skip_special_tokens: bool = True  # vLLM extra
    include_stop_str_in_output: bool = False  # vLLM extra
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None  # vLLM extra
    logit_bias: dict[str, float] | None = None
    allowed_token_ids: list[int] | None = None  # vLLM extra
    bad_words: list[str] | None = None  # vLLM extra
    prompt_logprobs: int | None = None  # vLLM extra
    user: str | None = None
    response_format: ResponseFormat | None = None
    guided_json: str | dict[str, Any] | None = None  # vLLM extras: structured outputs
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    structured_outputs: dict[str, Any] | None = None  # vLLM's newer form of the same
    # vLLM extra: each choice carries its generated ``token_ids`` (a stream chunk: the new ones,
    # sent as soon as they are generated, even when their text is still empty) and the
    # ``prompt_token_ids`` (chat: at the response's top level; streams: in the first chunk)
    return_token_ids: bool | None = None

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
        if self.stream_options is not None and not self.stream:
            raise APIError(400, "stream_options is only allowed with stream=true",
                           param="stream_options")

    def structured_output_params(self) -> StructuredOutputsParams | None:
        """The one output constraint among response_format, guided_* and structured_outputs;
        400 if several are given or one is malformed."""
        given = {}
        fmt = self.response_format
        if fmt is not None and fmt.type == "json_object":
            given["response_format"] = dict(json_object=True)
        elif fmt is not None and fmt.type == "json_schema":
            if fmt.json_schema is None or fmt.json_schema.json_schema is None:
                raise APIError(400, "response_format of type json_schema needs "
                                    "json_schema.schema", param="response_format")
            given["response_format"] = dict(json=fmt.json_schema.json_schema)
        for name, key in (("guided_json", "json"), ("guided_regex", "regex"),
                          ("guided_choice", "choice"), ("guided_grammar", "grammar")):
            if getattr(self, name) is not None:
                given[name] = {key: getattr(self, name)}
        if self.structured_outputs is not None:
            given["structured_outputs"] = self.structured_outputs
        if not given:
            return None
        if len(given) > 1:
            raise APIError(400, f"give one output constraint, not {', '.join(given)}",
                           param=next(iter(given)))
        name, fields = next(iter(given.items()))
        try:
            return StructuredOutputsParams(**fields)
        except TypeError as exc:  # unknown keys in structured_outputs
            raise APIError(400, f"{name}: {exc}", param=name) from None
        except ValueError as exc:
            raise APIError(400, f"{name}: {exc}", param=name) from None

    def sampling_params(self, max_tokens: int | None, logprobs: int | None,
                        prompt_logprobs: int | None = None) -> SamplingParams:
        """The engine's parameters (``logprobs``: top log-probabilities per generated token,
        None for none; a response sent whole needs only the final output, a stream what
        each step added); ValueError (-> 400) for out-of-range values."""
        optional = {name: getattr(self, name) for name in (
            "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
            "repetition_penalty") if getattr(self, name) is not None}
        return SamplingParams(
            n=self.n, max_tokens=max_tokens, min_tokens=self.min_tokens, seed=self.seed,
            stop=self.stop, stop_token_ids=self.stop_token_ids, ignore_eos=self.ignore_eos,
            skip_special_tokens=self.skip_special_tokens,
            include_stop_str_in_output=self.include_stop_str_in_output,
            logit_bias=self.logit_bias, allowed_token_ids=self.allowed_token_ids,
            bad_words=self.bad_words, logprobs=logprobs,
            prompt_logprobs=(self.prompt_logprobs if self.prompt_logprobs is not None
                             else prompt_logprobs),
            structured_outputs=self.structured_output_params(),
            output_kind=(RequestOutputKind.DELTA if self.stream
                         else RequestOutputKind.FINAL_ONLY), **optional)


class CompletionRequest(_GenerationRequest):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = DEFAULT_COMPLETION_MAX_TOKENS
    echo: bool | None = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt(cls, value: Any) -> Any:
        """A string or token ids, or a non-empty list of those."""
        if isinstance(value, str) or _is_token_ids(value):
            return value
        if isinstance(value, list):
            if not value:
                raise ValueError("prompt is empty")
            if all(isinstance(p, str) for p in value) or all(_is_token_ids(p) for p in value):
                return value
        raise ValueError("prompt must be a string, a list of token ids, or a list of strings "
                         "or of token-id lists")

    @property
    def prompts(self) -> list[str | list[int]]:
        """The prompts of this request (a batch of them, or one)."""
        value = self.prompt
        if isinstance(value, str) or _is_token_ids(value):
            return [value]
        return list(value)

    @property
    def num_logprobs(self) -> int | None:
        return self.logprobs

    def check_supported(self) -> None:
        super().check_supported()
        if self.best_of not in (None, self.n):
            raise APIError(400, "best_of is not supported (only best_of = n)", param="best_of")
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
        return None if value is None else content_text(value)


class ChatCompletionRequest(_GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None  # deprecated by OpenAI in favour of max_completion_tokens
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    add_generation_prompt: bool = True  # vLLM extras
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @property
    def requested_max_tokens(self) -> int | None:
        """None: fill what the context leaves after the prompt."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens

    @property
    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def check_supported(self) -> None:
        super().check_supported()
        if self.top_logprobs is not None and not self.logprobs:
            raise APIError(400, "top_logprobs needs logprobs=true", param="top_logprobs")
        if self.tools:
            raise APIError(400, "tools are not supported", param="tools")
        if self.tool_choice not in (None, "none"):
            raise APIError(400, "tool_choice is not supported", param="tool_choice")

    def conversation(self) -> list[dict[str, str]]:
        return [{"role": m.role, "content": m.content or ""} for m in self.messages]


def known_fields(model: type[BaseModel]) -> set[str]:
    """The top-level JSON keys a request model reads (field names and aliases)."""
    return {name for field_name, f in model.model_fields.items()
            for name in (field_name, f.alias) if name}


class TokenizeRequest(_Strict):
    """vLLM's /tokenize: a prompt, or chat messages rendered by the chat template."""
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None  # default: true for a prompt, false for messages
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    return_token_strs: bool = False

    def check(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise APIError(400, "give either prompt or messages", param="prompt")


class DetokenizeRequest(_Strict):
    model: str | None = None
    tokens: list[int]
