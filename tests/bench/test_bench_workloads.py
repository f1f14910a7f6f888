"""Workloads: the streamed JSON array reader, ShareGPT sampling, token lengths."""
import json
import logging

import pytest

from hifc.bench.workloads import (Conversation, TokenLengths, iter_json_array, read_sharegpt,
                                  sharegpt_path, sharegpt_requests, token_lengths)


def _record(i, turns):
    return {"id": f"r{i}", "conversations": [{"from": f, "value": v} for f, v in turns]}


RECORDS = [
    _record(0, [("human", "one two three four five"), ("gpt", "a b c d e f g")]),
    _record(1, [("gpt", "greeting first"), ("human", "then the question here please"),
                ("gpt", "and the answer comes here now")]),
    _record(2, [("human", "no reply")]),  # unusable
    _record(3, [("system", "sys"), ("human", "x y z w v"), ("human", "ignored second turn"),
                ("gpt", "reply to the first human turn")]),
    {"id": "not a conversation"},  # unusable
    _record(5, [("human", "short"), ("gpt", "tiny")]),
]


def write(tmp_path, text, name="sharegpt.json"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("chunk", [1, 7, 64, 1 << 20])
def test_iter_json_array_matches_json_loads_at_any_chunk_size(tmp_path, chunk):
    data = RECORDS + [[1, 2], "text with ] and , inside", 12345, 1.5, None, {"ü": "ß"}]
    path = write(tmp_path, json.dumps(data, indent=1, ensure_ascii=False))
    assert list(iter_json_array(path, chunk_chars=chunk)) == data


def test_iter_json_array_empty_and_compact(tmp_path):
    assert list(iter_json_array(write(tmp_path, " [ ] "))) == []
    assert list(iter_json_array(write(tmp_path, "[1,2,3]"), chunk_chars=2)) == [1, 2, 3]


def test_truncated_file_yields_the_complete_elements_and_warns(tmp_path, caplog):
    text = json.dumps(RECORDS, indent=2)
    path = write(tmp_path, text[: text.index('"r3"') + 10])  # cut inside record 3
    with caplog.at_level(logging.WARNING):
        items = list(iter_json_array(path, chunk_chars=16))
    assert items == RECORDS[:3]
    assert "stopped after 3 elements" in caplog.text


@pytest.mark.parametrize("text", ["", "   ", '{"a": 1}', "nope"])
def test_not_an_array_is_a_clear_error(tmp_path, text):
    with pytest.raises(ValueError, match="not a JSON array"):
        list(iter_json_array(write(tmp_path, text)))


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="cannot read"):
        list(iter_json_array(tmp_path / "absent.json"))


def test_read_sharegpt_takes_the_first_human_turn_and_the_gpt_reply_after_it(tmp_path):
    path = write(tmp_path, json.dumps(RECORDS))
    conversations, read = read_sharegpt(path)
    assert read == len(RECORDS)
    assert conversations == [
        Conversation("one two three four five", "a b c d e f g"),
        Conversation("then the question here please", "and the answer comes here now"),
        Conversation("x y z w v", "reply to the first human turn"),
        Conversation("short", "tiny")]
    first, read = read_sharegpt(path, max_conversations=2)
    assert (first, read) == (conversations[:2], 2)


def test_read_sharegpt_errors(tmp_path):
    with pytest.raises(ValueError, match="no conversation"):
        read_sharegpt(write(tmp_path, json.dumps(RECORDS[2:3] + RECORDS[4:5])))
    with pytest.raises(ValueError, match="must be positive"):
        read_sharegpt(write(tmp_path, json.dumps(RECORDS)), max_conversations=0)


WORDS = TokenLengths("words", lambda text: len(text.split()), None)


def test_sharegpt_requests_filter_and_are_seeded():
    conversations = [Conversation("w " * n, "r " * m)
                     for n, m in [(3, 10), (10, 3), (4, 4), (20, 20), (6, 8), (30, 1), (5, 5)]]
    requests = sharegpt_requests(conversations, 3, WORDS, vocab_size=100, max_model_len=16,
                                 seed=1)
    lengths = sorted((len(r.prompt_token_ids), r.output_tokens) for r in requests)
    assert lengths == [(4, 4), (5, 5), (6, 8)]  # < 4 tokens or > max_model_len left out
    assert all(3 <= t < 100 for r in requests for t in r.prompt_token_ids)
    again = sharegpt_requests(conversations, 3, WORDS, 100, 16, seed=1)
    assert again == requests
    other = sharegpt_requests(conversations, 3, WORDS, 100, 16, seed=2)
    assert sorted(other, key=lambda r: r.output_tokens) != sorted(requests,
                                                                  key=lambda r: r.output_tokens)


def test_sharegpt_output_len_override_and_shortage():
    conversations = [Conversation("a b c d e", "x"), Conversation("a b c d", "x y")]
    requests = sharegpt_requests(conversations, 2, WORDS, 50, 64, output_len=7)
    assert sorted(r.output_tokens for r in requests) == [7, 7]
    with pytest.raises(ValueError, match="only 0 of 2 ShareGPT conversations"):
        sharegpt_requests(conversations, 1, WORDS, 50, 64)  # replies under 4 tokens


class FakeTokenizer:
    def encode(self, text, add_special_tokens=True):
        ids = [10 + len(w) for w in text.split()]
        return ([1] if add_special_tokens else []) + ids


def test_model_tokenizer_gives_real_prompt_ids():
    lengths = token_lengths(FakeTokenizer())
    assert lengths.name == "model"
    assert lengths.count("aa bbb") == 2
    [request] = sharegpt_requests([Conversation("aa bbb c", "one two three four")], 1,
                                  lengths, 100, 64)
    assert request.prompt_token_ids == [1, 12, 13, 11]  # with the special token, like vLLM
    assert request.output_tokens == 4


def test_packaged_sharegpt_prefix_reads_fast():
    conversations, read = read_sharegpt(sharegpt_path(), max_conversations=50)
    assert read == 50
    assert 40 <= len(conversations) <= 50
    assert all(c.prompt and c.reply for c in conversations)
