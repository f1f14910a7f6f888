"""``RequestStream``: a reader that falls behind gets the outputs that queued up as one (the
server's streams ask for ``DELTA`` outputs, which are joined; snapshots keep the newest)."""
from __future__ import annotations

import asyncio

import pytest

from hifc.engine.outputs import CompletionOutput, Logprob, RequestOutput
from hifc.entrypoints.server.async_engine import RequestStream


def _output(completions: list[CompletionOutput], finished: bool = False,
            prompt_logprobs: list | None = None) -> RequestOutput:
    return RequestOutput("r", "p", [1, 2], completions, finished, prompt_logprobs)


def _read(items: list, delta: bool) -> list[RequestOutput]:
    """What a reader gets once all of ``items`` have queued up."""
    async def read() -> list[RequestOutput]:
        queue: asyncio.Queue = asyncio.Queue()
        for item in items:
            queue.put_nowait(item)
        return [out async for out in RequestStream(None, "r", queue, delta)]
    return asyncio.run(read())


def _lp(token: int) -> dict:
    return {token: Logprob(-0.5, 1)}


def test_queued_deltas_come_joined():
    prompt_logprobs = [None, _lp(2)]
    items = [
        _output([CompletionOutput(0, "He", [5], -0.5, [_lp(5)])], prompt_logprobs=prompt_logprobs),
        _output([CompletionOutput(1, "A", [7], -0.5, [_lp(7)])]),
        _output([CompletionOutput(0, "llo", [6], -1.0, [_lp(6)], "length"),
                 CompletionOutput(1, "", [8], -1.0, [_lp(8)], "stop", 8)], finished=True)]
    [out] = _read(items, delta=True)
    assert out.finished and out.prompt_logprobs is prompt_logprobs
    assert [(c.index, c.text, c.token_ids, c.cumulative_logprob, c.finish_reason,
             c.stop_reason, [list(p) for p in c.logprobs]) for c in out.outputs] == [
        (0, "Hello", [5, 6], -1.0, "length", None, [[5], [6]]),
        (1, "A", [7, 8], -1.0, "stop", 8, [[7], [8]])]


def test_queued_snapshots_keep_the_newest():
    items = [_output([CompletionOutput(0, "He", [5])]),
             _output([CompletionOutput(0, "Hello", [5, 6])]),
             _output([CompletionOutput(0, "Hello!", [5, 6, 9], finish_reason="stop")], True)]
    [out] = _read(items, delta=False)
    assert out.text == "Hello!" and out.token_ids == [5, 6, 9]


def test_a_finished_output_ends_the_join_and_an_error_ends_the_stream():
    first = _output([CompletionOutput(0, "a", [5])])
    last = _output([CompletionOutput(0, "b", [6], finish_reason="stop")], True)
    got = _read([first, last, _output([CompletionOutput(0, "c", [7])])], delta=True)
    assert [(o.text, o.finished) for o in got] == [("ab", True)]  # nothing after the end
    with pytest.raises(RuntimeError, match="engine failed"):
        _read([_output([CompletionOutput(0, "a", [5])]), RuntimeError("engine failed")],
              delta=True)
