"""``SamplingParams.output_kind`` (vLLM's ``RequestOutputKind``): what ``step()`` returns for a
request. FINAL_ONLY: one output, when it finished, equal to the last cumulative one. DELTA: the
new tokens, logprobs and text of each step, which add up to the cumulative output. No output
shows text a stop string may still cut. The same from the engine in this process and from one
in a process of its own (``DataParallelEngine``, whose replica sends deltas)."""
from __future__ import annotations

import dataclasses
from collections import defaultdict

import pytest

from hifc.engine.outputs import RequestOutput
from hifc.sampling_params import RequestOutputKind, SamplingParams

PROMPTS = ["The capital of France is", "Write a short poem about the sea:"]
GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, logprobs=2,
                        prompt_logprobs=1)
SAMPLED = SamplingParams(n=2, max_tokens=20, temperature=0.8, seed=5, ignore_eos=True)


def run(engine, params: list[SamplingParams], kind: RequestOutputKind,
        tag: str) -> dict[int, list[RequestOutput]]:
    """Every output step() returned, by prompt."""
    ids = {}
    for i, (prompt, p) in enumerate(zip(PROMPTS, params)):
        ids[f"kinds-{tag}-{kind.name}-{i}"] = i
        engine.add_request(f"kinds-{tag}-{kind.name}-{i}", prompt,
                           dataclasses.replace(p, output_kind=kind))
    outputs = defaultdict(list)
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs[ids[out.request_id]].append(out)
    return outputs


def plain(out: RequestOutput) -> list[list]:
    """Each completion's text, tokens, reasons and logprobs (as plain numbers)."""
    return [[c.index, c.text, list(c.token_ids), c.finish_reason, c.stop_reason,
             numbers(c.logprobs)] for c in sorted(out.outputs, key=lambda c: c.index)]


def numbers(logprobs) -> list[dict[int, float]]:
    return [{t: lp.logprob for t, lp in pos.items()} for pos in logprobs or []]


def joined(deltas: list[RequestOutput]) -> list[list]:
    """The DELTA outputs of one request added up, as ``plain`` gives a cumulative one."""
    by_index: dict[int, list] = {}
    for out in deltas:
        for c in out.outputs:
            index, text, tokens, finish, stop, logprobs = by_index.setdefault(
                c.index, [c.index, "", [], None, None, []])
            assert finish is None, "a completion went on after its finish"
            by_index[c.index] = [index, text + c.text, tokens + list(c.token_ids),
                                 c.finish_reason, c.stop_reason, logprobs + numbers(c.logprobs)]
    return [by_index[i] for i in sorted(by_index)]


def assert_same(got: list[list], want: list[list]) -> None:
    """Equal but for logprobs a few 1e-6 apart: an engine in its own process may batch a
    request alone in one run and beside another in the next."""
    assert [c[:5] for c in got] == [c[:5] for c in want]
    for g, w in zip(got, want):
        assert [list(p) for p in g[5]] == [list(p) for p in w[5]]
        assert all(abs(p[t] - q[t]) < 1e-4 for p, q in zip(g[5], w[5]) for t in p)


def check_kinds(engine, params: list[SamplingParams], tag: str) -> None:
    cumulative = run(engine, params, RequestOutputKind.CUMULATIVE, tag)
    final = run(engine, params, RequestOutputKind.FINAL_ONLY, tag)
    delta = run(engine, params, RequestOutputKind.DELTA, tag)
    for i in range(len(PROMPTS)):
        last = cumulative[i][-1]
        assert last.finished and len(cumulative[i]) > 3
        assert len(final[i]) == 1 and final[i][0].finished
        assert_same(plain(final[i][0]), plain(last))
        assert (final[i][0].prompt_logprobs is None) == (last.prompt_logprobs is None)
        assert [o.finished for o in delta[i]] == [False] * (len(delta[i]) - 1) + [True]
        assert_same(joined(delta[i]), plain(last))
        given = [o.prompt_logprobs for o in delta[i] if o.prompt_logprobs is not None]
        want = [last.prompt_logprobs] if last.prompt_logprobs else []
        assert [[p and list(p) for p in g] for g in given] == \
            [[p and list(p) for p in w] for w in want]  # once, with the first output
        merged = delta[i][0]  # RequestOutput.extend joins them the same way
        for later in delta[i][1:]:
            merged.extend(later)
        assert merged.finished and merged.prompt_logprobs is (given[0] if given else None)
        assert_same(plain(merged), plain(last))


@pytest.fixture(scope="module")
def engine(smollm2):
    return smollm2[0].engine


def test_final_only_and_delta_add_up_to_cumulative(engine):
    check_kinds(engine, [GREEDY, SAMPLED], "plain")


def test_outputs_never_show_text_a_stop_string_cuts_later(engine):
    """A stop string whose first half is decoded a step before its second: no output of any
    kind shows that first half (cumulative texts only grow; without the holdback, one would
    end in it and the next would be shorter)."""
    probe = run(engine, [GREEDY, SAMPLED], RequestOutputKind.CUMULATIVE, "probe")[0]
    final = probe[-1].text
    cut_at = next(len(o.text) for o in probe if 12 <= len(o.text) <= len(final) - 4)
    stop = final[cut_at - 2:cut_at + 2]
    params = [dataclasses.replace(GREEDY, stop=[stop]), dataclasses.replace(SAMPLED, stop=[stop])]
    cumulative = run(engine, params, RequestOutputKind.CUMULATIVE, "stop")
    last = cumulative[0][-1].outputs[0]
    assert last.stop_reason == stop and last.text == final[:final.index(stop)]
    assert all(last.text.startswith(o.outputs[0].text) for o in cumulative[0])
    check_kinds(engine, params, "stop")


def test_a_final_only_text_is_decoded_at_the_end(engine):
    """A final-only completion without stop strings decodes its text once, when its output is
    built (its equality with the cumulative text is checked above); one with a stop string, or
    of another kind, decodes token by token."""
    kinds = {"final": (RequestOutputKind.FINAL_ONLY, []),
             "final-stop": (RequestOutputKind.FINAL_ONLY, ["never"]),
             "cumulative": (RequestOutputKind.CUMULATIVE, [])}
    for rid, (kind, stop) in kinds.items():
        engine.add_request(f"at-end-{rid}", PROMPTS[0],
                           dataclasses.replace(GREEDY, output_kind=kind, stop=stop))
    completions = {rid: engine._completions[f"at-end-{rid}"] for rid in kinds}
    assert [c.text_at_end for c in completions.values()] == [True, False, False]
    texts = {rid: [] for rid in kinds}
    final = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            final[out.request_id] = out.outputs[0].text
        for rid, c in completions.items():
            texts[rid].append(c.detokenizer.text)
    assert set(texts["final"][:-1]) == {""} and texts["final"][-1] == final["at-end-final"]
    for rid in ("final-stop", "cumulative"):
        assert len(set(texts[rid])) > 10 and texts[rid][-1] == final[f"at-end-{rid}"]
    assert len(set(final.values())) == 1


@pytest.mark.slow
def test_an_engine_process_gives_the_same_kinds():
    from hifc.config import EngineConfig
    from hifc.parallel.data_parallel import DataParallelEngine

    engine = DataParallelEngine(EngineConfig(model="smollm2-135m", device="cpu", block_size=16,
                                             max_model_len=512))
    received = defaultdict(int)  # deltas from the replica, by request
    apply = engine._apply

    def counting_apply(delta):
        received[delta[0]] += 1
        apply(delta)

    engine._apply = counting_apply
    try:
        check_kinds(engine, [GREEDY, SAMPLED], "process")
        check_kinds(engine, [dataclasses.replace(GREEDY, stop=["ab", "e"]), SAMPLED],
                    "process-stop")
    finally:
        engine.close()
    # a final-only request costs the replica one message, the others one per step
    assert {r: n for r, n in received.items() if "FINAL_ONLY" in r} == {
        f"kinds-{tag}-FINAL_ONLY-{i}": 1 for tag in ("process", "process-stop")
        for i in range(len(PROMPTS))}
    assert all(n > 10 for r, n in received.items()  # 20-24 tokens, no stop string
               if r.startswith("kinds-process-") and "FINAL_ONLY" not in r and "stop" not in r)


@pytest.mark.parametrize("bad", [3, -1, True, 1.0, "delta", None])
def test_bad_output_kind_is_refused(bad):
    with pytest.raises(ValueError, match="output_kind must be a RequestOutputKind"):
        SamplingParams(output_kind=bad)


def test_stop_holdback():
    assert SamplingParams().stop_holdback == 0
    assert SamplingParams(stop=["abc", "x"]).stop_holdback == 2
    assert SamplingParams(stop=["abc"], include_stop_str_in_output=True).stop_holdback == 0
