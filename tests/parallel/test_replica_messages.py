"""A replica's output deltas: what each message carries, and that it pickles as plain data (no
class is looked up per delta on either side of the queue)."""
import pickle
import pickletools

from hifc.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from hifc.parallel.messages import Outputs
from hifc.parallel.replica import DeltaWriter


def output(tokens: list[int], text: str, finished: bool = False) -> RequestOutput:
    completion = CompletionOutput(0, text, tokens, finish_reason="stop" if finished else None)
    return RequestOutput("r", None, [1, 2], [completion], finished,
                         metrics=RequestMetrics(10.0, 10.5, 11.0, 12.0,
                                                12.0 if finished else None),
                         num_cached_tokens=0)


def test_deltas_carry_what_changed_and_the_metrics():
    writer = DeltaWriter()
    writer.add("r")
    assert writer.delta(output([5, 6], "ab")) == (
        "r", [(0, [5, 6], None, 0, "ab", None, None, None)], False, 0, None,
        (10.0, 10.5, 11.0, 12.0, None))
    unchanged = writer.delta(output([5, 6], "ab"))
    assert unchanged[1] == []
    # a stop string cut "b": keep 1 character, append the rest
    last = writer.delta(output([5, 6, 7], "ax", finished=True))
    assert last[1] == [(0, [7], None, 1, "x", None, "stop", None)] and last[2] is True
    assert last[5] == (10.0, 10.5, 11.0, 12.0, 12.0)
    assert writer.delta(output([5, 6, 7], "ax", finished=True)) is None  # forgotten


def test_a_step_of_deltas_pickles_without_class_lookups():
    writer = DeltaWriter()
    deltas = []
    for i in range(8):
        writer.add("r")
        deltas.append(writer.delta(output([i], "t")))
    pickled = pickle.dumps(deltas, protocol=pickle.HIGHEST_PROTOCOL)
    globals_ = [op.name for op, _, _ in pickletools.genops(pickled)
                if op.name in ("GLOBAL", "STACK_GLOBAL", "REDUCE", "NEWOBJ", "BUILD")]
    assert globals_ == []
    message = pickle.loads(pickle.dumps(Outputs(0, deltas, {"steps": 1})))
    assert message.deltas == deltas
