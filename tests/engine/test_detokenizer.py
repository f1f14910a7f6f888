"""The incremental detokenizer through the fast tokenizer's decode stream gives, token by
token, the text that decoding a window twice per token gives: on SmolLM2's byte-level BPE and
on a SentencePiece-style tokenizer (Metaspace, byte fallback), over real text, special tokens,
unknown ids and random ids that split characters; stop strings cut it the same way."""
from __future__ import annotations

import random

import pytest

from hifc.engine.detokenizer import IncrementalDetokenizer
from hifc.loader.tokenizer import DecodeStream, Tokenizer

TEXT = ("Héllo, wörld! 你好 🙂🎉 — it's 3.14 ... ( a ) ?\n\tdone. `x = [1, 2]`\n\n"
        "Ünïcödé and more text, spread over enough tokens to cross several windows.")


def _smollm2() -> Tokenizer:
    from hifc.loader import smollm2_gguf_path
    return Tokenizer.from_gguf(smollm2_gguf_path())


def _sentencepiece_style() -> Tokenizer:
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = RawTokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    raw.normalizer = normalizers.Replace(" ", "\u2581")
    raw.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first",
                                                 split=False)
    raw.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<unk>", "<s>", "</s>"]
                                  + byte_tokens, show_progress=False)
    raw.train_from_iterator([TEXT.replace("\u00e9", "e"), "the quick brown fox " * 20],
                            trainer=trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<s>", eos_token="</s>",
                                 unk_token="<unk>", clean_up_tokenization_spaces=False)
    return Tokenizer(hf)


TOKENIZERS = {"smollm2": _smollm2, "sentencepiece-style": _sentencepiece_style}


def _sequences(tok: Tokenizer) -> list[list[int]]:
    rng = random.Random(0)
    vocab = tok.vocab_size
    text = tok.encode(TEXT, add_special_tokens=False)
    specials = sorted(tok.eos_token_ids) + [tok.bos_token_id]
    return [text, text[:9] + specials + text[9:] + [vocab + 5] + text[:4],
            *([rng.randrange(vocab) for _ in range(120)] for _ in range(30))]


def _texts(tok: Tokenizer, ids: list[int], skip: bool, stop=(), check_stop=True):
    detok = IncrementalDetokenizer(tok, skip, stop)
    texts, hit = [], None
    for i in range(1, len(ids) + 1):
        hit = detok.update(ids[:i], check_stop)
        texts.append(detok.text)
        if hit is not None:
            break
    return texts, hit


def _windowed(tok: Tokenizer, monkeypatch) -> Tokenizer:
    monkeypatch.setattr(tok, "decode_stream", lambda skip_special_tokens=True: None)
    return tok


@pytest.mark.parametrize("name", list(TOKENIZERS))
def test_the_decode_stream_gives_the_window_decodes_text_token_by_token(name, monkeypatch):
    if DecodeStream is None:
        pytest.skip("this tokenizers has no DecodeStream")
    streamed = TOKENIZERS[name]()
    assert streamed.decode_stream() is not None
    windowed = _windowed(TOKENIZERS[name](), monkeypatch)
    for ids in _sequences(streamed):
        for skip in (True, False):
            # byte fallback breaks tokenizers' own stream on some of the random ids (tokenizers
            # 0.23): the detokenizer then goes on by windows, with the same text
            assert _texts(streamed, ids, skip) == _texts(windowed, ids, skip), (ids, skip)
    text = _texts(streamed, streamed.encode(TEXT, add_special_tokens=False), True)[0][-1]
    assert text == TEXT or name != "smollm2"  # byte-level BPE round-trips any text


@pytest.mark.parametrize("at", [0, 1, 7, 30])
def test_a_stream_that_breaks_goes_on_by_windows_with_the_same_text(at, monkeypatch):
    """The stream raising tokenizers' "Invalid prefix" error at token ``at`` (one at a time, or
    within a catch-up of several tokens) leaves the text as windows give it; another error
    from the stream is raised."""
    if DecodeStream is None:
        pytest.skip("this tokenizers has no DecodeStream")
    tok, windowed = _sentencepiece_style(), _windowed(_sentencepiece_style(), monkeypatch)
    real = tok.decode_stream

    def breaking(skip_special_tokens=True, message="Invalid prefix encountered"):
        step, seen = real(skip_special_tokens), [0]

        def stepped(token_id):
            seen[0] += 1
            if seen[0] == at + 1:
                raise Exception(message)
            return step(token_id)
        return stepped

    ids = _sequences(tok)[1] + _sequences(tok)[2][:20]
    monkeypatch.setattr(tok, "decode_stream", breaking)
    assert _texts(tok, ids, True) == _texts(windowed, ids, True)
    caught_up = []
    for t in (tok, windowed):  # the break inside a catch-up of several tokens
        detok = IncrementalDetokenizer(t, False, ())
        for end in (at + 5, at + 9, len(ids)):
            detok.update(ids[:end])
        caught_up.append(detok.text)
    assert caught_up[0] == caught_up[1]
    monkeypatch.setattr(tok, "decode_stream",
                        lambda skip_special_tokens=True: breaking(skip_special_tokens, "other"))
    with pytest.raises(Exception, match="other"):
        _texts(tok, ids, True)


@pytest.mark.parametrize("include", [False, True])
def test_stop_strings_cut_the_streamed_text_as_the_windowed(include, monkeypatch):
    streamed, windowed = _smollm2(), _windowed(_smollm2(), monkeypatch)
    ids = streamed.encode(TEXT, add_special_tokens=False)
    stop = ("wörld", "never")
    results = []
    for tok in (streamed, windowed):
        detok = IncrementalDetokenizer(tok, True, stop, include_stop_str_in_output=include)
        hits = []
        for i in range(1, len(ids) + 1):
            hits.append(detok.update(ids[:i], check_stop=i > 2))
            if hits[-1] is not None:
                break
        results.append((detok.text, hits))
    assert results[0] == results[1]
    text, hits = results[0]
    assert hits[-1] == "wörld" and not any(hits[:-1]) and text == ("Héllo, wörld" if include else "Héllo, ")


def test_a_tokenizer_that_decodes_through_transformers_has_no_stream():
    tok = _smollm2()
    tok._backend_decode = None  # what a tokenizer that cleans up spaces gets
    assert tok.decode_stream() is None
    detok = IncrementalDetokenizer(tok, True, ())
    ids = tok.encode(TEXT, add_special_tokens=False)
    for i in range(1, len(ids) + 1):
        detok.update(ids[:i])
    assert detok.text == TEXT


@pytest.mark.parametrize("name", list(TOKENIZERS))
@pytest.mark.parametrize("streamed", [True, False])
def test_a_catch_up_gives_the_text_of_one_token_at_a_time(name, streamed, monkeypatch):
    """Tokens taken in one call (a final-only text decoded at the end) give the text they give
    one per call, through the stream and through windows: over random ids that split
    characters, too, where one window over all of them would hold back a text ending in an
    incomplete character."""
    tok = TOKENIZERS[name]()
    if not streamed:
        _windowed(tok, monkeypatch)
    elif DecodeStream is None:
        pytest.skip("this tokenizers has no DecodeStream")
    for ids in _sequences(tok):
        for skip in (True, False):
            whole = IncrementalDetokenizer(tok, skip, ())
            assert whole.update(ids, check_stop=False) is None
            halves = IncrementalDetokenizer(tok, skip, ())
            halves.update(ids[:len(ids) // 2])
            halves.update(ids)
            assert whole.text == halves.text == _texts(tok, ids, skip)[0][-1], (ids, skip)
