import random
import subprocess
import sys
import textwrap
import tracemalloc

import pytest

from hifc.tiers.allocator import APPEND, LEFT_APPEND, FCBlockAllocator


def churn(policy: str, num_blocks: int = 64, steps: int = 600, seed: int = 1):
    """Allocate sequences of 1-6 blocks, write them, free random ones; check each pick."""
    rng = random.Random(seed)
    alloc = FCBlockAllocator(num_blocks, policy)
    live: list[list[int]] = []
    in_use: set[int] = set()
    picks = []  # (block, set of ids in use just before it was picked)
    for _ in range(steps):
        n = rng.randint(1, 6)
        while not alloc.can_allocate(n):
            victim = live.pop(rng.randrange(len(live)))  # random frees punch holes
            alloc.free(victim)
            in_use.difference_update(victim)
        for block in (ids := alloc.allocate(n)):
            picks.append((block, frozenset(in_use)))
            in_use.add(block)
        alloc.mark_written(ids)
        live.append(ids)
    return alloc, picks


@pytest.mark.parametrize("num_blocks", [64, 333])  # one bitmap word; several, the last partial
def test_append_is_sequential_modulo_wrap_under_churn(num_blocks):
    alloc, picks = churn(APPEND, num_blocks, steps=600 * num_blocks // 64)
    trace = alloc.trace()
    assert trace == [b for b, _ in picks]
    wraps = 0
    for (prev, _), (cur, used) in zip(picks, picks[1:]):
        # The head only moves forward: every id skipped between prev and cur was in use.
        skipped = [(prev + d) % num_blocks for d in range(1, (cur - prev) % num_blocks)]
        assert all(b in used for b in skipped), (prev, cur)
        wraps += cur < prev
    assert wraps > 5  # the churn really went round the file
    stats = alloc.stats()
    assert stats.backward_jumps == 0
    assert stats.wraps == wraps
    assert stats.blocks_written == len(trace)


def test_left_append_is_not_sequential_under_churn():
    num_blocks = 64
    alloc, picks = churn(LEFT_APPEND, num_blocks)
    for block, used in picks:  # always the lowest free id
        assert block == min(set(range(num_blocks)) - used)
    back = 0
    for (prev, _), (cur, used) in zip(picks, picks[1:]):
        skipped = [(prev + d) % num_blocks for d in range(1, (cur - prev) % num_blocks)]
        back += not all(b in used for b in skipped)
    assert back > 50  # jumps back over free blocks: random I/O
    assert alloc.stats().backward_jumps > 50
    append_runs = churn(APPEND, num_blocks)[0].stats().sequential_runs
    assert alloc.stats().sequential_runs > append_runs


def test_append_wraps_to_reclaim_freed_blocks():
    alloc = FCBlockAllocator(4, APPEND)
    assert alloc.allocate(3) == [0, 1, 2]
    alloc.free([0])
    assert alloc.allocate(2) == [3, 0]  # after the last one, then round to the freed block
    alloc.free([1, 2])
    assert alloc.allocate(2) == [1, 2]
    assert not alloc.can_allocate(1)


def test_left_append_takes_lowest():
    alloc = FCBlockAllocator(5, LEFT_APPEND)
    assert alloc.allocate(3) == [0, 1, 2]
    alloc.free([1])
    assert alloc.allocate(2) == [1, 3]
    alloc = FCBlockAllocator(200, LEFT_APPEND)  # several bitmap words, the last one partial
    alloc.allocate(199)
    alloc.free([149, 3, 130, 70])
    assert alloc.allocate(5) == [3, 70, 130, 149, 199]


def test_stats_and_trace_export(tmp_path):
    alloc = FCBlockAllocator(8, APPEND)
    first = alloc.allocate(3)
    alloc.mark_written(first)
    second = alloc.allocate(2)
    alloc.mark_written(second)
    stats = alloc.stats()
    assert (stats.blocks_written, stats.sequential_runs, stats.wraps) == (5, 1, 0)
    assert stats.num_free_blocks == 3 and stats.mean_run_blocks == 5.0
    path = tmp_path / "trace.txt"
    assert alloc.export_trace(path) == 5
    lines = path.read_text().splitlines()
    assert lines[0] == "# hifc FC block write trace: policy=append num_blocks=8"
    assert lines[1:] == ["0 1 2", "3 4"]  # one swap-out per line


def test_exported_trace_loads_in_wafsim(tmp_path):
    swaptrace = pytest.importorskip("hifc.analysis.swaptrace")
    alloc, _ = churn(APPEND, 32, steps=50)
    path = tmp_path / "trace.txt"
    alloc.export_trace(path)
    trace = swaptrace.load_trace(str(path))
    assert trace.block_ids.tolist() == alloc.trace()
    assert trace.tier_blocks == 32


def test_errors_are_clear():
    with pytest.raises(ValueError, match="policy"):
        FCBlockAllocator(4, "random")
    with pytest.raises(ValueError, match="num_blocks"):
        FCBlockAllocator(0)
    alloc = FCBlockAllocator(4)
    with pytest.raises(ValueError, match="only 4 of 4 are free"):
        alloc.allocate(5)
    ids = alloc.allocate(2)
    alloc.free(ids[:1])
    with pytest.raises(ValueError, match="double free"):
        alloc.free(ids[:1])
    with pytest.raises(ValueError, match="out of range"):
        alloc.free([9])
    with pytest.raises(ValueError, match="not allocated"):
        alloc.mark_written([0])
    assert alloc.can_allocate(3) and not alloc.can_allocate(4)
    assert alloc.num_free_blocks == 3  # failed calls changed nothing


def test_take_and_seek():
    alloc = FCBlockAllocator(8, APPEND)
    alloc.take([2, 5])
    assert alloc.num_free_blocks == 6 and alloc.is_allocated(5)
    assert alloc.allocate(3) == [0, 1, 3]  # taking a block does not move the head
    alloc.seek(6)
    assert alloc.allocate(2) == [6, 7]
    assert alloc.allocate(1) == [4]  # wrapped: 2 and 5 are still taken
    for bad, message in (([5], "not free"), ([9], "out of range"), ([4, 4], "not free")):
        with pytest.raises(ValueError, match=message):
            alloc.take(bad)
    alloc.free([2])
    with pytest.raises(ValueError, match="twice"):
        alloc.take([2, 2])
    with pytest.raises(ValueError, match="out of range"):
        alloc.seek(8)
    assert alloc.num_free_blocks == 1


def test_allocator_imports_without_torch():
    code = textwrap.dedent("""
        import sys
        sys.modules['torch'] = None  # any 'import torch' now fails
        from hifc.tiers.allocator import FCBlockAllocator
        from hifc.tiers import FCBlockAllocator as again, KVGeometry
        a = FCBlockAllocator(16, 'append')
        a.mark_written(a.allocate(4))
        assert a.trace() == [0, 1, 2, 3]
        assert 'torch' not in [m for m, v in sys.modules.items() if v is not None]
        print('ok')
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_large_allocator_is_fast_enough():
    alloc = FCBlockAllocator(50_000, APPEND)
    ids = alloc.allocate(30_000)
    alloc.free(ids[::2])
    assert len(alloc.allocate(20_000)) == 20_000


def test_ten_tib_tier_costs_little_memory():
    """15 million blocks (10 TiB of 700 KB blocks): bits and counters per 64 blocks, not a
    Python object per block."""
    tracemalloc.start()
    try:
        alloc = FCBlockAllocator(15_000_000, APPEND)
        ids = alloc.allocate(1000)
        alloc.mark_written(ids)
        alloc.free(ids[::2])
        assert alloc.allocate(3) == [1000, 1001, 1002]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"{peak / 2**20:.0f} MiB"
    assert alloc.num_free_blocks == 15_000_000 - 503
    assert alloc.allocate(1) == [1003]


def test_trace_keeps_only_the_latest_swap_outs(tmp_path):
    alloc = FCBlockAllocator(16, APPEND, trace_limit=5)
    for _ in range(10):
        ids = alloc.allocate(2)
        alloc.mark_written(ids)
        alloc.free(ids)
    assert alloc.trace() == [0, 1, 2, 3]  # the last two swap-outs (after the wrap) fit in 5
    stats = alloc.stats()
    assert stats.blocks_written == 20 and stats.wraps == 1  # statistics count every write
    path = tmp_path / "trace.txt"
    assert alloc.export_trace(path) == 4
    assert path.read_text().splitlines()[1:] == [
        "# the 16 oldest block writes are not kept (trace_limit=5)", "0 1", "2 3"]
    silent = FCBlockAllocator(4, APPEND, trace_limit=0)  # 0: no trace at all
    silent.mark_written(silent.allocate(2))
    assert silent.trace() == [] and silent.stats().blocks_written == 2
