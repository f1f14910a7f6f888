"""Structured outputs through xgrammar: grammars compiled from the model's tokenizer, one
matcher per sequence, and the step's token bitmasks filled for all guided sequences at once.

xgrammar is an optional dependency (``pip install 'hifc[structured]'``); it is imported when the
first structured request arrives.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
from typing import Iterable, Iterator

import torch

from hifc.loader.tokenizer import Tokenizer
from hifc.structured.params import StructuredOutputsParams

_XGRAMMAR_LOG_PREFIX = re.compile(r"^\[[\d:]+\] \S+: ")


def _xgrammar():
    try:
        import xgrammar
    except ImportError:
        raise ValueError("structured outputs need the xgrammar package: "
                         "pip install 'hifc[structured]' (or pip install xgrammar)") from None
    return xgrammar


class GrammarCompiler:
    """Compiles structured-output parameters into grammars over one tokenizer's vocabulary
    (padded to the model's ``vocab_size``); compiled grammars are cached by xgrammar."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, stop_token_ids: Iterable[int]):
        xgr = _xgrammar()
        info = xgr.TokenizerInfo.from_huggingface(tokenizer.hf_tokenizer, vocab_size=vocab_size,
                                                  stop_token_ids=sorted(stop_token_ids))
        self._xgr = xgr
        self._compiler = xgr.GrammarCompiler(info)
        self.vocab_size = vocab_size

    def compile(self, params: StructuredOutputsParams):
        """The compiled grammar; ValueError naming what is wrong with a bad schema, regex or
        grammar."""
        compile_name, _, args, kwargs = _builders(params)
        with _refusing(params.kind):
            return getattr(self._compiler, compile_name)(*args, **kwargs)

    def matcher(self, compiled) -> "GrammarState":
        return GrammarState(self._xgr.GrammarMatcher(compiled))

    def bitmask_filler(self) -> "BitmaskFiller":
        return BitmaskFiller(self._xgr, self.vocab_size)


def check_grammar(params: StructuredOutputsParams) -> None:
    """ValueError, as ``GrammarCompiler.compile`` raises it, if the schema, regex or grammar is
    bad: it is parsed, not compiled. What a front end checks before it queues a request for an
    engine elsewhere; compiling (per-token tables over the vocabulary, after a table of every
    token: 0.17 s for SmolLM2's 49,152 tokens on a 2-core CPU, then 1-8 ms for each new JSON
    schema, against about 0.1 ms to parse one) is the engine's work."""
    _, parse_name, args, kwargs = _builders(params)
    with _refusing(params.kind):
        getattr(_xgrammar().Grammar, parse_name)(*args, **kwargs)


def _builders(params: StructuredOutputsParams) -> tuple[str, str, tuple, dict]:
    """The constraint's xgrammar builders: the ``GrammarCompiler`` method that compiles it, the
    ``Grammar`` constructor that parses it, and the arguments both take."""
    kind = params.kind
    if kind == "json":
        return ("compile_json_schema", "from_json_schema", (params.json,),
                {"any_whitespace": not params.disable_any_whitespace})
    if kind == "json_object":
        return "compile_builtin_json_grammar", "builtin_json_grammar", (), {}
    if kind == "regex":
        return "compile_regex", "from_regex", (params.regex,), {}
    ebnf = _choice_ebnf(params.choice) if kind == "choice" else params.grammar
    return "compile_grammar", "from_ebnf", (ebnf,), {}


@contextlib.contextmanager
def _refusing(kind: str) -> Iterator[None]:
    """xgrammar's errors about a bad grammar as ValueErrors that name it."""
    try:
        yield
    except RuntimeError as exc:
        message = _XGRAMMAR_LOG_PREFIX.sub("", str(exc).strip())
        raise ValueError(f"invalid {kind} for structured outputs: {message}") from None


def _choice_ebnf(choices: tuple[str, ...]) -> str:
    """An EBNF grammar of exactly these strings (JSON string escapes are EBNF's)."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


class GrammarState:
    """One sequence's matcher, advanced over the tokens it has accepted."""

    def __init__(self, matcher):
        self.matcher = matcher
        self.num_accepted = 0
        self.rejected = False  # a token outside the grammar arrived: the sequence must end

    def advance(self, output_token_ids: list[int]) -> None:
        """Feed the tokens generated since the last call."""
        for token in output_token_ids[self.num_accepted:]:
            if self.rejected or self.matcher.is_terminated():
                break
            if not self.matcher.accept_token(token):
                self.rejected = True
        self.num_accepted = len(output_token_ids)

    @property
    def finished(self) -> bool:
        """The grammar accepted a stop token, or cannot go on."""
        return self.rejected or self.matcher.is_terminated()

    @property
    def accepted_stop(self) -> bool:
        """The last token fed was a stop token the grammar accepted: it ended the sequence."""
        return not self.rejected and self.matcher.is_terminated()


# guided sequences per xgrammar thread in a step's bitmask fill: fewer rows per thread cost
# more in handing out the work than they save (64 rows of a JSON schema on the GPU machine's
# host, median per step: 0.26-0.45 ms in the calling thread, 1.2-3.7 ms with xgrammar's default
# 8 threads; docs/RESULTS.md)
ROWS_PER_THREAD = 64


class BitmaskFiller:
    """Fills the next-token bitmasks of several matchers in one call: in the calling thread,
    or in one of xgrammar's threads per ``ROWS_PER_THREAD`` rows, at most ``max_threads``
    (default xgrammar's own: half the cores)."""

    def __init__(self, xgr, vocab_size: int, max_threads: int | None = None):
        self._xgr = xgr
        self._max_threads = max_threads or max(1, (os.cpu_count() or 2) // 2)
        self._batches: dict[int, object] = {}  # thread count -> BatchGrammarMatcher
        self.vocab_size = vocab_size

    def fill(self, states: list[GrammarState]) -> torch.Tensor:
        """Bitmasks [len(states), ceil(V/32)] int32 (host memory): bit 1 = token allowed."""
        bitmask = self._xgr.allocate_token_bitmask(len(states), self.vocab_size)
        threads = min(self._max_threads, max(1, len(states) // ROWS_PER_THREAD))
        batch = self._batches.get(threads)
        if batch is None:
            batch = self._batches[threads] = self._xgr.BatchGrammarMatcher(threads)
        batch.batch_fill_next_token_bitmask([s.matcher for s in states], bitmask)
        return bitmask
