"""``Tokenizer.decode`` through the fast tokenizer's own decoder gives transformers' text,
and falls back to transformers' ``decode`` where that cleans up spaces."""
from __future__ import annotations

import random

import pytest

from hifc.loader.tokenizer import Tokenizer


def _windows(ids: list[int], seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [ids[i:i + rng.randrange(1, 12)] for i in range(0, len(ids) - 1, 3)]


def _assert_same_as_transformers(tok: Tokenizer, ids: list[int]) -> None:
    for window in _windows(ids):
        for skip in (True, False):
            assert tok.decode(window, skip) == \
                tok.hf_tokenizer.decode(window, skip_special_tokens=skip), (window, skip)


def test_smollm2_decodes_as_transformers_does():
    from hifc.loader import smollm2_gguf_path
    tok = Tokenizer.from_gguf(smollm2_gguf_path())
    assert tok._backend_decode is not None
    text = "Héllo, wörld! 你好 🙂 — it's 3.14 ... ( a ) ?\n\tdone"
    ids = tok.encode(text) + sorted(tok.eos_token_ids) + tok.encode(" again, and again.")
    _assert_same_as_transformers(tok, ids)


@pytest.mark.parametrize("cleans_up", [False, True])
def test_a_tokenizer_that_cleans_up_spaces_decodes_through_transformers(tmp_path, cleans_up):
    from transformers import AutoTokenizer

    from tests.fixtures import save_tiny_tokenizer

    save_tiny_tokenizer(tmp_path)
    hf = AutoTokenizer.from_pretrained(str(tmp_path), local_files_only=True)
    hf.clean_up_tokenization_spaces = True
    switch = "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"
    skips_bpe = hasattr(hf, switch)  # transformers versions that skip the clean-up for BPE
    if cleans_up:  # transformers then cleans up even for this BPE model
        setattr(hf, switch, True)
    tok = Tokenizer(hf)
    assert (tok._backend_decode is None) == (cleans_up or not skips_bpe)
    ids = tok.encode("a , b . c ! d ? e 's f n't") + [2]
    _assert_same_as_transformers(tok, ids)
    if cleans_up:
        assert tok.decode(tok.encode("a , b ."), True) == "a, b."
