"""The physical ideal's decode model: weights once per step, every running sequence's KV."""
from hifc.bench.costs import decode_bytes


def test_one_request_reads_its_growing_context_each_step():
    # prompt 10, 4 output tokens: the prefill yields one, 3 decode steps at contexts 11, 12, 13
    steps, nbytes = decode_bytes(100, 2, [(10, 4)], max_num_seqs=8)
    assert steps == 3
    assert nbytes == 3 * 100 + 2 * (11 + 12 + 13)


def test_requests_beyond_max_num_seqs_wait_for_a_free_slot():
    # two slots, three requests of 3 outputs (2 decode steps each): a, b run, then c
    steps, nbytes = decode_bytes(0, 1, [(1, 3), (1, 3), (5, 3)], max_num_seqs=2)
    assert steps == 4
    assert nbytes == (2 + 2) + (3 + 3) + 6 + 7


def test_single_token_outputs_need_no_decode_step():
    assert decode_bytes(100, 2, [(10, 1), (20, 1)], max_num_seqs=8) == (0, 0)
