"""vLLM's sampling API through LLM / LLMEngine on a tiny model with a tokenizer: n, stop reasons,
min_tokens, max_tokens=None, bad words, allowed tokens, logprobs, prompt dicts, chat options,
structured outputs, and bad values rejected before anything is queued."""
from __future__ import annotations

import re

import pytest
import torch

from hifc import LLM, SamplingParams
from hifc.sampling_params import GuidedDecodingParams, StructuredOutputsParams
from tests.fixtures import make_tiny_hf_model

EOS = 2  # <|im_end|> of the tiny tokenizer
PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    model_dir = make_tiny_hf_model(tmp_path_factory.mktemp("sampling") / "tiny", "llama")
    return LLM(str(model_dir), device="cpu", block_size=16, max_model_len=64)


def _gen(llm, prompt=PROMPT, **params):
    return llm.generate([prompt], SamplingParams(**params), use_tqdm=False)[0]


def _idle(llm) -> bool:
    stats = llm.stats()
    return (not llm.engine.has_unfinished_requests()
            and stats["gpu_blocks_free"] == stats["gpu_blocks_total"])


def test_n_seeded_completions_are_reproducible_and_different(llm):
    out = _gen(llm, n=4, seed=11, temperature=1.0, max_tokens=8, ignore_eos=True)
    samples = [tuple(c.token_ids) for c in out.outputs]
    assert [c.index for c in out.outputs] == [0, 1, 2, 3]
    assert len(set(samples)) == 4 and all(len(s) == 8 for s in samples)
    again = _gen(llm, n=4, seed=11, temperature=1.0, max_tokens=8, ignore_eos=True)
    assert [tuple(c.token_ids) for c in again.outputs] == samples
    greedy = _gen(llm, n=4, temperature=0, max_tokens=8, ignore_eos=True)
    assert len({tuple(c.token_ids) for c in greedy.outputs}) == 1
    assert greedy.outputs[0].token_ids == _gen(llm, temperature=0, max_tokens=8,
                                               ignore_eos=True).token_ids
    assert _idle(llm)


def test_n_completions_prefill_the_prompt_once(llm):
    prompt = list(range(100, 140))  # 40 tokens (none cached yet): two full blocks of 16, 8 more
    before = llm.stats()
    computed = []
    launch = llm.engine.runner.launch_forward

    def counting(out, *args):
        computed.extend(len(w.token_ids) for w in out.scheduled if w.start_pos < len(prompt))
        return launch(out, *args)

    llm.engine.runner.launch_forward = counting
    try:
        out = _gen(llm, prompt, n=4, seed=1, temperature=1.0, max_tokens=3, ignore_eos=True,
                   prompt_logprobs=1)
    finally:
        llm.engine.runner.launch_forward = launch
    after = llm.stats()
    # the first sequence computes the prompt; the other three share its two full blocks and
    # compute only the 8 tokens of the partial block
    assert sorted(computed) == [8, 8, 8, 40]
    assert after["prefix_cache_hits"] - before["prefix_cache_hits"] == 3 * 32
    assert len(out.outputs) == 4 and len(out.prompt_logprobs) == 40
    assert _idle(llm)


def test_prompt_logprobs_over_chunked_prefill_match_one_step(llm):
    chunked = LLM(llm.engine.config.model, device="cpu", block_size=16, max_model_len=64,
                  max_num_batched_tokens=16, max_num_seqs=4)
    prompt = list(range(200, 240))  # 40 tokens: chunks of 16, 16 and 8
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, prompt_logprobs=2,
                            logprobs=1)
    whole = llm.generate([prompt], params, use_tqdm=False)[0]
    parts = chunked.generate([prompt], params, use_tqdm=False)[0]
    assert parts.token_ids == whole.token_ids and len(parts.prompt_logprobs) == 40
    for a, b in zip(parts.prompt_logprobs[1:], whole.prompt_logprobs[1:]):
        assert a.keys() == b.keys()
        assert all(abs(a[t].logprob - b[t].logprob) < 1e-4 for t in a)


def test_min_tokens_holds_back_eos_and_stop_tokens(llm):
    forced_eos = dict(temperature=0, max_tokens=20, logit_bias={EOS: 100.0})
    assert _gen(llm, **forced_eos).token_ids == [EOS]
    held = _gen(llm, min_tokens=5, **forced_eos)
    assert len(held.token_ids) == 6 and held.token_ids[-1] == EOS
    assert EOS not in held.token_ids[:5]
    assert held.finish_reason == "stop" and held.outputs[0].stop_reason is None
    stop = _gen(llm, temperature=0, max_tokens=20, logit_bias={50: 100.0}, stop_token_ids=[50],
                min_tokens=3)
    assert stop.token_ids == [stop.token_ids[0], stop.token_ids[1], stop.token_ids[2], 50]
    assert 50 not in stop.token_ids[:3] and stop.outputs[0].stop_reason == 50


@pytest.mark.parametrize("stop", [[], ["@never@"]])  # text decoded at the end; token by token
def test_the_token_that_stops_a_sequence_is_left_out_of_its_text(llm, stop):
    """As vLLM's: the EOS or stop token that ended a sequence stays in its token ids but not in
    its text, unless ``include_stop_str_in_output``; a sequence cut by length keeps it all."""
    tok = llm.get_tokenizer()
    word = tok.encode("hello", add_special_tokens=False)[0]
    piece = tok.decode([word])
    assert piece
    base = dict(temperature=0, max_tokens=10, min_tokens=2, skip_special_tokens=False,
                stop=stop)
    for ender, bias, shown in ((EOS, {}, "<|im_end|>"), (word, {"stop_token_ids": [word]}, piece)):
        params = dict(base, logit_bias={ender: 100.0}, **bias)
        cut, kept = _gen(llm, **params), _gen(llm, include_stop_str_in_output=True, **params)
        assert cut.token_ids == kept.token_ids and cut.token_ids[-1] == ender
        assert len(cut.token_ids) == 3 and cut.finish_reason == "stop"
        assert kept.outputs[0].text == cut.outputs[0].text + shown
    length = _gen(llm, **dict(base, logit_bias={word: 100.0}, max_tokens=3, ignore_eos=True))
    assert length.finish_reason == "length" and length.outputs[0].text.endswith(piece)


@pytest.mark.parametrize("stop", [[], ["@never@"]])
@pytest.mark.parametrize("ignore_eos", [False, True])
def test_a_grammar_ends_its_sequence_at_the_eos_it_accepts(llm, stop, ignore_eos):
    """Under ignore_eos too; the EOS is left out of the text as above."""
    pytest.importorskip("xgrammar")
    params = dict(temperature=1.0, seed=1, max_tokens=20, skip_special_tokens=False, stop=stop,
                  ignore_eos=ignore_eos,
                  structured_outputs=StructuredOutputsParams(choice=["flash", "dram"]))
    cut, kept = _gen(llm, **params), _gen(llm, include_stop_str_in_output=True, **params)
    assert cut.token_ids[-1] == EOS and cut.finish_reason == "stop"
    assert cut.outputs[0].text in ("flash", "dram")
    assert kept.outputs[0].text == cut.outputs[0].text + "<|im_end|>"


def test_stop_strings_report_the_string_and_can_be_kept(llm):
    free = _gen(llm, temperature=0, max_tokens=16, ignore_eos=True).text
    stop = next((free[i:i + 2] for i in range(2, len(free) - 2) if free[i:i + 2].strip()), None)
    if stop is None:
        pytest.skip("greedy text too short to pick a stop string from")
    cut = _gen(llm, temperature=0, max_tokens=16, ignore_eos=True, stop=[stop])
    assert cut.text == free[:free.index(stop)] and cut.finish_reason == "stop"
    assert cut.outputs[0].stop_reason == stop
    kept = _gen(llm, temperature=0, max_tokens=16, ignore_eos=True, stop=[stop],
                include_stop_str_in_output=True)
    assert kept.text == free[:free.index(stop) + len(stop)]


def test_max_tokens_none_fills_the_context(llm):
    ids = list(range(10, 20))
    out = _gen(llm, ids, temperature=0, max_tokens=None, ignore_eos=True)
    assert len(out.token_ids) == 64 - len(ids) and out.finish_reason == "length"


def test_bad_words_and_allowed_token_ids(llm):
    free = _gen(llm, temperature=0, max_tokens=12, ignore_eos=True)
    word = free.text.split()[0]
    banned = _gen(llm, temperature=0, max_tokens=12, ignore_eos=True, bad_words=[word])
    assert word not in banned.text.split()
    words = [llm.get_tokenizer().encode(w, add_special_tokens=False) for w in (word, " " + word)]
    for ids in words:
        text_ids = banned.token_ids
        assert not any(text_ids[i:i + len(ids)] == ids for i in range(len(text_ids)))
    allowed = [40, 41, 42]
    out = _gen(llm, temperature=1.0, seed=3, max_tokens=12, ignore_eos=True,
               allowed_token_ids=allowed)
    assert set(out.token_ids) <= set(allowed)


def test_logprobs_outputs_and_metrics(llm):
    ids = llm.get_tokenizer().encode(PROMPT)
    out = _gen(llm, temperature=0, max_tokens=5, ignore_eos=True, logprobs=2, prompt_logprobs=1)
    completion = out.outputs[0]
    assert len(completion.logprobs) == 5
    total = 0.0
    for token, position in zip(completion.token_ids, completion.logprobs):
        assert token in position and position[token].rank == 1  # greedy: the most likely
        top = sorted(position.values(), key=lambda lp: lp.rank)
        assert [lp.rank for lp in top][:2] == [1, 2] and len(position) <= 3
        assert top[0].logprob >= top[1].logprob
        assert position[token].decoded_token == llm.get_tokenizer().decode(
            [token], skip_special_tokens=False)
        total += position[token].logprob
    assert completion.cumulative_logprob == pytest.approx(total)
    assert out.prompt_token_ids == ids and len(out.prompt_logprobs) == len(ids)
    assert out.prompt_logprobs[0] is None
    assert all(tok in pos for tok, pos in zip(ids[1:], out.prompt_logprobs[1:]))
    m = out.metrics
    assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.last_token_time
    assert m.finished_time == m.last_token_time and out.num_cached_tokens == 0
    plain = _gen(llm, temperature=0, max_tokens=5, ignore_eos=True)
    assert plain.outputs[0].logprobs is None and plain.outputs[0].cumulative_logprob is None
    assert plain.prompt_logprobs is None and plain.token_ids == completion.token_ids


def test_prompt_dicts_and_chat_options(llm):
    tok = llm.get_tokenizer()
    ids = tok.encode(PROMPT)
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    plain = [o.token_ids for o in llm.generate([PROMPT, ids], greedy, use_tqdm=False)]
    dicts = [o.token_ids for o in llm.generate([{"prompt": PROMPT}, {"prompt_token_ids": ids}],
                                               greedy, use_tqdm=False)]
    assert dicts == plain
    assert llm.generate({"prompt": PROMPT}, greedy, use_tqdm=False)[0].token_ids == plain[0]
    with pytest.raises(ValueError, match="prompt dict"):
        llm.generate({"prompt": PROMPT, "multi_modal_data": {}}, greedy, use_tqdm=False)

    parts = [{"role": "user", "content": [{"type": "text", "text": "Hello"},
                                          {"type": "text", "text": "world"}]}]
    text = [{"role": "user", "content": "Hello\nworld"}]
    assert llm.chat(parts, greedy, use_tqdm=False)[0].prompt == \
        llm.chat(text, greedy, use_tqdm=False)[0].prompt
    cont = llm.chat(text + [{"role": "assistant", "content": "Sure"}], greedy, use_tqdm=False,
                    add_generation_prompt=False, continue_final_message=True)[0]
    assert cont.prompt.endswith("Sure")
    custom = llm.chat(text, greedy, use_tqdm=False,
                      chat_template="{{ messages[0]['content'] }} -> ")[0]
    assert custom.prompt == "Hello\nworld -> "
    with pytest.raises(ValueError, match="cannot both be true"):
        llm.chat(text, greedy, use_tqdm=False, continue_final_message=True)
    with pytest.raises(ValueError, match="only text"):
        llm.chat([{"role": "user", "content": [{"type": "image_url"}]}], greedy, use_tqdm=False)


def test_structured_choice_and_regex(llm):
    pytest.importorskip("xgrammar")
    choices = ["flash memory", "dram"]
    for seed in range(3):
        out = _gen(llm, temperature=1.0, seed=seed, max_tokens=20,
                   structured_outputs=StructuredOutputsParams(choice=choices))
        assert out.text in choices and out.finish_reason == "stop"
    pattern = r"[a-c]{2,4}-[0-9]{2}"
    old_name = GuidedDecodingParams(regex=pattern)  # vLLM's older name, same class
    out = _gen(llm, temperature=1.0, seed=5, max_tokens=20, guided_decoding=old_name)
    assert re.fullmatch(pattern, out.text), out.text


@pytest.mark.parametrize("params, message", [
    (dict(logprobs=21), "max_logprobs"),
    (dict(prompt_logprobs=30), "max_logprobs"),
    (dict(allowed_token_ids=[10 ** 6]), "outside the vocabulary"),
    (dict(logit_bias={10 ** 6: 1.0}), "outside the vocabulary"),
    (dict(stop_token_ids=[10 ** 6]), "outside the vocabulary"),
    (dict(max_tokens=None, min_tokens=60), "min_tokens"),
    (dict(structured_outputs=StructuredOutputsParams(json={"type": "nope"})), "invalid json"),
    (dict(structured_outputs=StructuredOutputsParams(regex="(")), "invalid regex"),
])
def test_bad_values_are_rejected_before_anything_is_queued(llm, params, message):
    if "structured_outputs" in params:
        pytest.importorskip("xgrammar")
    good = SamplingParams(max_tokens=2)
    with pytest.raises(ValueError, match=message):
        llm.generate([PROMPT, PROMPT], [good, SamplingParams(**params)], use_tqdm=False)
    assert _idle(llm)


def test_abort_ends_every_completion(llm):
    engine = llm.engine
    engine.add_request("many", PROMPT, SamplingParams(n=3, max_tokens=30, ignore_eos=True))
    engine.step()
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request("many", PROMPT, SamplingParams())
    engine.abort_request("many")
    while engine.has_unfinished_requests():
        engine.step()
    assert _idle(llm)


@pytest.mark.parametrize("kwargs, message", [
    (dict(n=0), r"n must be in \[1, 4096\], got 0"),
    (dict(n=4097), r"n must be in \[1, 4096\]"),
    (dict(n=10 ** 20), "an integer of 67 bits"),  # refused before it builds any sequence
    (dict(n=1.5), "n must be an integer"),
    (dict(presence_penalty=2.5), r"presence_penalty must be in \[-2, 2\], got 2.5"),
    (dict(frequency_penalty=-2.1), r"frequency_penalty must be in \[-2, 2\]"),
    (dict(repetition_penalty=0.0), "repetition_penalty must be greater than zero"),
    (dict(min_p=1.5), r"min_p must be in \[0, 1\]"),
    (dict(temperature=150.0), "temperature must be at most 100"),
    (dict(top_k=-2), r"top_k must be -1 or 0 \(disabled\)"),
    (dict(min_tokens=-1), "min_tokens must be greater than or equal to 0"),
    (dict(min_tokens=5, max_tokens=4), "min_tokens must be less than or equal to max_tokens=4"),
    (dict(logprobs=-1), "logprobs must be a non-negative integer"),
    (dict(prompt_logprobs=-1), "prompt_logprobs must be a non-negative integer"),
    (dict(max_tokens=0), "max_tokens must be at least 1"),
    (dict(allowed_token_ids=[]), "allowed_token_ids must not be empty"),
    (dict(logit_bias={"x": 1.0}), "logit_bias keys must be token ids"),
    (dict(logit_bias={1: float("nan")}), "must be a finite number"),
    (dict(bad_words=[""]), "bad_words strings must be non-empty strings"),
    (dict(stop=["a"], detokenize=False), "stop strings need detokenize"),
    (dict(structured_outputs=StructuredOutputsParams(regex="a"),
          guided_decoding=StructuredOutputsParams(regex="b")), "not both"),
])
def test_sampling_params_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_sampling_params_defaults_and_normalisation():
    p = SamplingParams()
    assert (p.n, p.max_tokens, p.top_k, p.min_p, p.repetition_penalty, p.logprobs) == \
        (1, 16, 0, 0.0, 1.0, None)
    p = SamplingParams(logit_bias={"5": 150.0, 6: -3}, stop="x", bad_words=["no"],
                       allowed_token_ids=[1, 2], guided_decoding=GuidedDecodingParams(
                           choice=["a", "b"]))
    assert p.logit_bias == {5: 100.0, 6: -3.0}  # keys as ints, clamped to OpenAI's range
    assert p.stop == ("x",) and p.bad_words == ("no",) and p.allowed_token_ids == (1, 2)
    assert p.structured_outputs.choice == ("a", "b") and p.guided_decoding is None
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams(regex="a", choice=["b"])
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams()


BAD_CONSTRAINTS = [dict(json={"type": "nope"}), dict(json={"minimum": "x", "type": "integer"}),
                   dict(regex="("), dict(regex="a{3,1}"), dict(grammar="root ::= "),
                   dict(grammar="root ::= other")]
GOOD_CONSTRAINTS = [dict(json={"type": "object", "properties": {"a": {"type": "integer"}}}),
                    dict(json_object=True), dict(regex="[a-c]+"), dict(choice=["x", "y z"]),
                    dict(grammar='root ::= "a" | "b"')]


def test_a_front_end_refuses_what_the_compiler_refuses_without_compiling(llm):
    """``check_grammar`` (a data-parallel front end's check: parse, no tokenizer) refuses every
    bad constraint with the compiler's own message, and passes what the compiler compiles."""
    pytest.importorskip("xgrammar")
    from hifc.structured.grammar import GrammarCompiler, check_grammar

    compiler = GrammarCompiler(llm.get_tokenizer(), 384, {EOS})
    for constraint in BAD_CONSTRAINTS:
        params = StructuredOutputsParams(**constraint)
        with pytest.raises(ValueError) as compiled:
            compiler.compile(params)
        with pytest.raises(ValueError) as checked:
            check_grammar(params)
        assert str(checked.value) == str(compiled.value), constraint
        assert str(checked.value).startswith(f"invalid {params.kind} for structured outputs: ")
    for constraint in GOOD_CONSTRAINTS:
        params = StructuredOutputsParams(**constraint)
        compiler.compile(params)
        check_grammar(params)


def test_bitmasks_are_the_matchers_own_in_the_calling_thread_or_in_xgrammar_s(llm):
    """A step's bitmasks, filled in the calling thread (few rows) or shared out among
    xgrammar's threads (``ROWS_PER_THREAD`` rows each), are each matcher's own mask."""
    xgr = pytest.importorskip("xgrammar")
    from hifc.structured.grammar import ROWS_PER_THREAD, BitmaskFiller, GrammarCompiler

    compiler = GrammarCompiler(llm.get_tokenizer(), 384, {EOS})
    grammars = [compiler.compile(StructuredOutputsParams(**c)) for c in GOOD_CONSTRAINTS]
    filler = BitmaskFiller(xgr, 384, max_threads=3)
    for rows in (5, 2 * ROWS_PER_THREAD + 1):
        states = [compiler.matcher(grammars[i % len(grammars)]) for i in range(rows)]
        for i, state in enumerate(states[::7]):  # some a few tokens into their grammar
            tokens = []
            for _ in range(i % 3):
                allowed = filler.fill([state])[0]
                token = next((t for t in range(384) if allowed[t // 32] >> (t % 32) & 1
                              and t != EOS), None)
                if token is None:  # the grammar can only end here
                    break
                tokens.append(token)
                state.advance(tokens)
        want = torch.cat([filler.fill([state]) for state in states])
        assert torch.equal(filler.fill(states), want)
    assert sorted(filler._batches) == [1, 2]  # one thread, then two for 129 rows


def test_structured_outputs_without_xgrammar_say_what_to_install(llm, monkeypatch):
    import sys

    from hifc.structured.grammar import GrammarCompiler
    monkeypatch.setitem(sys.modules, "xgrammar", None)  # import xgrammar now fails
    with pytest.raises(ValueError, match=r"pip install 'hifc\[structured\]'"):
        GrammarCompiler(llm.get_tokenizer(), 384, {EOS})
