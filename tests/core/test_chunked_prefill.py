"""Chunked prefill in the scheduler: the step's token budget goes to decodes first, then to
prompt chunks; a sequence samples only when its last chunk runs."""
import pytest

from hifc.core.scheduler import attention_pairs, longest_chunk_within
from hifc.core.sequence import SequenceStatus
from tests.core.helpers import FakeTier, make_scheduler, make_seq, run_step


def shape(out):
    return [(w.request_id, w.start_pos, len(w.token_ids), w.samples) for w in out.scheduled]


def test_a_long_prompt_is_prefilled_over_several_steps_and_samples_once():
    sched, kv = make_scheduler(budget=32, max_len=256, num_blocks=16)
    seqs = {"a": make_seq("a", 100, max_tokens=3)}
    sched.add(seqs["a"])
    steps = [run_step(sched, seqs) for _ in range(4)]
    assert [shape(o) for o in steps] == [[("a", 0, 32, False)], [("a", 32, 32, False)],
                                          [("a", 64, 32, False)], [("a", 96, 4, True)]]
    assert seqs["a"].output_token_ids == [5]  # only the last chunk sampled
    assert len(kv.block_table("a")) == 7  # blocks grow with the chunks: 101 tokens
    assert shape(run_step(sched, seqs)) == [("a", 100, 1, True)]


def test_decodes_go_first_and_keep_decoding_while_a_prompt_is_chunked():
    sched, kv = make_scheduler(budget=16, max_len=256, num_blocks=16)
    seqs = {"d": make_seq("d", 4, max_tokens=20)}
    sched.add(seqs["d"])
    run_step(sched, seqs)
    seqs["p"] = make_seq("p", 40, max_tokens=2, arrival=1)
    sched.add(seqs["p"])
    steps = [shape(run_step(sched, seqs)) for _ in range(3)]
    assert steps == [[("d", 4, 1, True), ("p", 0, 15, False)],
                     [("d", 5, 1, True), ("p", 15, 15, False)],
                     [("d", 6, 1, True), ("p", 30, 10, True)]]
    assert len(seqs["d"].output_token_ids) == 4 and seqs["p"].output_token_ids == [5]


def test_long_prefill_token_threshold_caps_each_sequence_chunk():
    # budget 64, threshold 12: two prompts take 12-token chunks side by side, the decode its
    # token; a short prompt under the cap goes whole
    sched, kv = make_scheduler(budget=64, max_len=256, num_blocks=32, long_prefill=12)
    seqs = {"d": make_seq("d", 4, max_tokens=20)}
    sched.add(seqs["d"])
    assert shape(run_step(sched, seqs)) == [("d", 0, 4, True)]
    for rid, n in (("p", 30), ("q", 20), ("s", 5)):
        seqs[rid] = make_seq(rid, n, max_tokens=2, arrival=1)
        sched.add(seqs[rid])
    steps = [shape(run_step(sched, seqs)) for _ in range(3)]
    assert steps == [[("d", 4, 1, True), ("p", 0, 12, False), ("q", 0, 12, False),
                      ("s", 0, 5, True)],
                     [("d", 5, 1, True), ("s", 5, 1, True), ("p", 12, 12, False),
                      ("q", 12, 8, True)],
                     [("d", 6, 1, True), ("q", 20, 1, True), ("p", 24, 6, True)]]


@pytest.mark.parametrize("context", [0, 1, 7, 100, 4095, 32767])
def test_longest_chunk_within_is_the_largest_chunk_that_fits_the_pairs(context):
    for pairs in (0, 1, context, context + 1, 3 * context + 5, 10**6, 2**21 + 3):
        n = longest_chunk_within(context, pairs)
        assert attention_pairs(context, n) <= pairs < attention_pairs(context, n + 1)


def test_prefill_attention_budget_shrinks_chunks_as_the_prompt_advances():
    # 600 query-key pairs per step: 34 tokens from 0 (595 pairs), then 14 after 34 (581),
    # 11 after 48 (594), ...; the decode beside it is not counted
    sched, kv = make_scheduler(budget=64, max_len=256, num_blocks=32, attention_budget=600)
    seqs = {"d": make_seq("d", 4, max_tokens=40)}
    sched.add(seqs["d"])
    run_step(sched, seqs)
    seqs["p"] = make_seq("p", 120, max_tokens=2, arrival=1)
    sched.add(seqs["p"])
    chunks = []
    while not chunks or not chunks[-1][2]:
        out = run_step(sched, seqs)
        assert out.scheduled[0].request_id == "d" and len(out.scheduled[0].token_ids) == 1
        (p,) = [w for w in out.scheduled if w.request_id == "p"]
        chunks.append((p.start_pos, len(p.token_ids), p.samples))
    assert chunks[:3] == [(0, 34, False), (34, 14, False), (48, 11, False)]
    sizes = [n for _, n, _ in chunks]
    assert sum(sizes) == 120 and sizes == sorted(sizes, reverse=True)
    for start, n, _ in chunks:
        assert attention_pairs(start, n) <= 600 < attention_pairs(start, n + 1) or \
            start + n == 120


def test_prefill_attention_budget_is_shared_by_the_chunks_of_a_step():
    # 300 pairs: the first prompt takes 24 tokens (300 pairs), the second none this step;
    # the token budget alone would have given both their whole prompt
    sched, kv = make_scheduler(budget=64, max_len=128, num_blocks=32, attention_budget=300)
    seqs = {"a": make_seq("a", 30, max_tokens=2), "b": make_seq("b", 20, max_tokens=2)}
    for s in seqs.values():
        sched.add(s)
    assert shape(run_step(sched, seqs)) == [("a", 0, 24, False)]
    # a: 6 left after 24 (6*24 + 21 = 165 pairs); b: 15 tokens in the 135 pairs left (120)
    assert shape(run_step(sched, seqs)) == [("a", 24, 6, True), ("b", 0, 15, False)]


def test_prefill_attention_budget_counts_a_cached_prefix_as_context():
    # the second prompt shares the first's 64-token prefix (4 blocks of 16): its chunks start
    # after 64 cached tokens, so 600 pairs give it 8 tokens (8*64 + 36 = 548), not 34
    sched, kv = make_scheduler(budget=128, max_len=256, num_blocks=32, prefix_caching=True,
                               attention_budget=600)
    prefix = list(range(1, 65))
    seqs = {"a": make_seq("a", 0, max_tokens=2, tokens=prefix + [100, 101]),
            "b": make_seq("b", 0, max_tokens=2, arrival=1, tokens=prefix + list(range(200, 230)))}
    sched.add(seqs["a"])
    while seqs["a"].num_computed_tokens < 66:
        run_step(sched, seqs)
    sched.add(seqs["b"])
    steps = [shape(run_step(sched, seqs)) for _ in range(2)]
    assert [w for w in steps[0] if w[0] == "b"] == [("b", 64, 8, False)]
    assert [w for w in steps[1] if w[0] == "b"] == [("b", 72, 7, False)]  # 7*72 + 28 = 532


def test_without_chunking_a_prompt_waits_for_a_budget_that_holds_it_whole():
    sched, kv = make_scheduler(budget=40, max_len=40, chunked=False)
    seqs = {"a1": make_seq("a1", 5, max_tokens=3), "a2": make_seq("a2", 5, max_tokens=3),
            "b": make_seq("b", 39, max_tokens=1, arrival=1)}
    for s in seqs.values():
        sched.add(s)
    assert shape(run_step(sched, seqs)) == [("a1", 0, 5, True), ("a2", 0, 5, True)]
    assert shape(run_step(sched, seqs)) == [("a1", 5, 1, True), ("a2", 5, 1, True)]  # 38 left
    run_step(sched, seqs)  # a1 and a2 end
    assert shape(run_step(sched, seqs)) == [("b", 0, 39, True)]


def test_recompute_after_preemption_is_chunked_too():
    sched, kv = make_scheduler(num_blocks=4, budget=16, max_len=64)
    seqs = {f"r{i}": make_seq(f"r{i}", 16, max_tokens=30, arrival=i) for i in range(2)}
    for s in seqs.values():
        sched.add(s)
    for _ in range(18):
        out = run_step(sched, seqs)
        if out.preempted_request_ids:
            break
    assert out.preempted_request_ids == ["r1"]
    n_tokens = seqs["r1"].num_tokens
    chunks = []  # r1's work until it samples again
    while not chunks or not chunks[-1][2]:
        out = run_step(sched, seqs)
        chunks += [(w.start_pos, len(w.token_ids), w.samples) for w in out.scheduled
                   if w.request_id == "r1"]
    # re-prefilled over prompt + generated tokens in chunks of the budget, once r0 has ended:
    # beside r0, the free blocks never held r1's tokens and both sequences' next growth
    # (readmitted sooner, r1 would be the victim again when r0 needs a block)
    assert n_tokens == 31 and chunks == [(0, 16, False), (16, 15, True)]
    assert seqs["r0"].status is SequenceStatus.FINISHED_LENGTH
    assert sched.num_preemptions == 1


def test_a_sequence_swapped_out_mid_prefill_resumes_its_prefill():
    tier = FakeTier(16)
    sched, kv = make_scheduler(num_blocks=6, budget=16, max_len=96, mode="swap", tier=tier)
    seqs = {"old": make_seq("old", 30, max_tokens=60), "new": make_seq("new", 60, arrival=1)}
    sched.add(seqs["old"])
    run_step(sched, seqs)
    run_step(sched, seqs)  # old is decoding
    sched.add(seqs["new"])
    while not (out := run_step(sched, seqs)).swap_out:
        pass
    assert [o.request_id for o in out.swap_out] == ["new"]
    new = seqs["new"]
    computed = new.num_computed_tokens
    assert 0 < computed < 60 and new.output_token_ids == []
    sched.swap_out_done("new", ok=True)
    sched.finish(seqs["old"], SequenceStatus.FINISHED_ABORTED)
    out = sched.schedule()
    assert [o.request_id for o in out.swap_in] == ["new"]
    sched.swap_in_done("new", ok=True)
    assert shape(run_step(sched, seqs))[0][:2] == ("new", computed)
    while new.status is SequenceStatus.RUNNING:
        run_step(sched, seqs)
    assert kv.num_free_blocks == kv.num_total_blocks and len(tier.free_ids) == 16
