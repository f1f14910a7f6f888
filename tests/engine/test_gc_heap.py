"""``frozen_heap``: objects that exist when it starts are out of the collector's reach until it
ends (the start-up state a full collection would otherwise walk), then collectable again."""
import gc
import weakref

from hifc.engine.gc_heap import frozen_heap


class Node:
    pass


def cycle() -> weakref.ref:
    """A reference cycle only the collector can free, dropped at once; a weak reference to it."""
    node = Node()
    node.self = node
    return weakref.ref(node)


def test_objects_from_before_are_frozen_until_the_end():
    live = Node()
    live.self = live  # alive when the heap freezes, garbage inside the block
    ref = weakref.ref(live)
    with frozen_heap():
        assert gc.get_freeze_count() > 0
        del live
        gc.collect()
        assert ref() is not None, "a frozen object was collected"
        later = cycle()  # what the engine allocates while it runs is still collected
        gc.collect()
        assert later() is None
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert ref() is None


def test_garbage_from_before_is_collected_before_freezing():
    ref = cycle()
    with frozen_heap():
        assert ref() is None


def test_unfrozen_after_an_error():
    try:
        with frozen_heap():
            raise KeyError("step failed")
    except KeyError:
        pass
    assert gc.get_freeze_count() == 0


def frozen_garbage_survives(block) -> None:
    """A cycle alive when an outer frozen_heap starts, garbage inside it, is still frozen
    after ``block()`` runs there; collected once the outer block ends."""
    live = Node()
    live.self = live
    ref = weakref.ref(live)
    with frozen_heap():
        del live
        block()
        gc.collect()
        assert ref() is not None, "the inner block unfroze the outer one's objects"
    gc.collect()
    assert ref() is None


def test_a_block_inside_another_leaves_the_heap_frozen():
    def inner():
        with frozen_heap(collect=False):
            assert gc.get_freeze_count() > 0

    frozen_garbage_survives(inner)
    assert gc.get_freeze_count() == 0


def test_without_the_collection_garbage_from_before_waits_for_the_end():
    ref = cycle()
    with frozen_heap(collect=False):
        gc.collect()
        assert ref() is not None
    gc.collect()
    assert ref() is None


def test_generate_runs_its_steps_on_a_frozen_heap():
    from hifc import LLM, SamplingParams

    llm = LLM("random:tiny-llama", device="cpu", block_size=16, num_gpu_blocks=16)
    counts = []
    step = llm.engine.step

    def counting_step():
        counts.append(gc.get_freeze_count())
        return step()

    llm.engine.step = counting_step
    params = SamplingParams(max_tokens=3, temperature=0.0)
    out = llm.generate([[1, 2, 3]], params, use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 3
    assert counts and all(c > 0 for c in counts)
    assert gc.get_freeze_count() == 0
    frozen_garbage_survives(lambda: llm.generate([[1, 2, 3]], params, use_tqdm=False))


def test_objects_frozen_before_the_block_do_not_stop_it():
    """A library that froze a few objects of its own (one did as the interpreter started on
    the GPU machine) is no enclosing block: the heap is still frozen, and unfrozen after."""
    gc.freeze()
    assert gc.get_freeze_count() > 0
    frozen_garbage_survives(lambda: None)
    assert gc.get_freeze_count() == 0


def young_collections(block) -> int:
    """How many times the young generation was collected while ``block()`` ran."""
    before = gc.get_stats()[0]["collections"]
    block()
    return gc.get_stats()[0]["collections"] - before


def test_a_steps_churn_collects_no_young_generation_inside_the_block():
    """Thousands of containers alive at once (a step's outputs at a few hundred requests) pass
    Python's threshold of 700 several times over; inside the block they pass none."""
    def step():
        outputs = [[i, (i,), {"i": i}] for i in range(2_000)]  # 6,000 containers
        del outputs

    thresholds = gc.get_threshold()
    assert young_collections(step) > 0  # Python's own threshold
    with frozen_heap():
        assert gc.get_threshold()[0] > thresholds[0]
        assert young_collections(step) == 0
        with frozen_heap(collect=False):
            assert young_collections(step) == 0
        assert young_collections(step) == 0
    assert gc.get_threshold() == thresholds
    try:
        with frozen_heap():
            raise KeyError("step failed")
    except KeyError:
        pass
    assert gc.get_threshold() == thresholds
