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
