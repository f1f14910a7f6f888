"""A replica's output deltas: what each message carries, and that it pickles as plain data (no
class is looked up per delta on either side of the queue)."""
import pickle
import pickletools

from hifc.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from hifc.parallel.messages import Outputs
from hifc.parallel.replica import _delta


def delta_output(tokens: list[int], text: str, finished: bool = False) -> RequestOutput:
    """A DELTA output: what one step added."""
    completion = CompletionOutput(0, text, tokens, finish_reason="stop" if finished else None)
    return RequestOutput("r", None, [1, 2], [completion], finished,
                         metrics=RequestMetrics(10.0, 10.5, 11.0, 12.0,
                                                12.0 if finished else None),
                         num_cached_tokens=0)


def test_a_delta_carries_the_step_and_the_metrics():
    assert _delta(delta_output([5, 6], "ab")) == (
        "r", [(0, [5, 6], None, "ab", None, None, None)], False, 0, None,
        (10.0, 10.5, 11.0, 12.0, None))
    last = _delta(delta_output([7], "x", finished=True))
    assert last[1] == [(0, [7], None, "x", None, "stop", None)] and last[2] is True
    assert last[5] == (10.0, 10.5, 11.0, 12.0, 12.0)


def test_a_step_of_deltas_pickles_without_class_lookups():
    deltas = [_delta(delta_output([i], "t")) for i in range(8)]
    pickled = pickle.dumps(deltas, protocol=pickle.HIGHEST_PROTOCOL)
    globals_ = [op.name for op, _, _ in pickletools.genops(pickled)
                if op.name in ("GLOBAL", "STACK_GLOBAL", "REDUCE", "NEWOBJ", "BUILD")]
    assert globals_ == []
    message = pickle.loads(pickle.dumps(Outputs(0, deltas, {"steps": 1}, 8, False)))
    assert message.deltas == deltas


def _tracked(kind):
    from hifc.parallel.data_parallel import _Tracked
    from hifc.sampling_params import RequestOutputKind

    kind = RequestOutputKind[kind]
    whole = kind is not RequestOutputKind.DELTA
    return _Tracked("p", [1, 2], kind, {0: CompletionOutput(0, "", [])} if whole else {})


def test_the_front_end_joins_the_deltas_that_came_since_a_delta_request_s_last_output():
    tracked = _tracked("DELTA")
    metrics = RequestMetrics(10.0)
    for tokens, text in (([5], "a"), ([6, 7], "bc")):
        tracked.apply(_delta(delta_output(tokens, text))[1][0])
    first = tracked.output("r", False, 0, metrics)
    assert [(c.text, c.token_ids) for c in first.outputs] == [("abc", [5, 6, 7])]
    assert tracked.output("r", False, 0, metrics).outputs == []  # nothing came since
    tracked.apply(_delta(delta_output([8], "d", finished=True))[1][0])
    last = tracked.output("r", True, 0, metrics)
    assert [(c.text, c.token_ids, c.finish_reason) for c in last.outputs] == [("d", [8], "stop")]
    assert first.outputs[0].token_ids == [5, 6, 7]  # an output given is not changed later


def test_the_front_end_folds_deltas_into_snapshots_for_a_cumulative_request():
    tracked = _tracked("CUMULATIVE")
    metrics = RequestMetrics(10.0)
    tracked.apply(_delta(delta_output([5], "a"))[1][0])
    first = tracked.output("r", False, 0, metrics)
    tracked.apply(_delta(delta_output([6], "b", finished=True))[1][0])
    last = tracked.output("r", True, 0, metrics)
    assert (first.text, first.token_ids) == ("a", [5])
    assert (last.text, last.token_ids, last.finish_reason) == ("ab", [5, 6], "stop")
