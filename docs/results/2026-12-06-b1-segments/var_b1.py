"""var_b1.py SEGMENTS MERGE_ROWS cli-args: a batch-1 decode launch split into SEGMENTS segments
(0: the backend's plan) with MERGE_ROWS as the in-launch merge's limit (0: the module's), then
the CLI. Every other plan is the backend's."""
import dataclasses
import sys

from hifc.layers import triton_attention as ta

segments, merge_rows = int(sys.argv[1]), int(sys.argv[2])
if merge_rows:
    ta.MERGE_ROWS = merge_rows
if segments:
    plain = ta.plan_launch

    def plan_launch(max_query_len, max_seq_len, num_seqs, *args, **kwargs):
        plan = plain(max_query_len, max_seq_len, num_seqs, *args, **kwargs)
        if max_query_len == 1 and num_seqs == 1 and plan.num_segments > 1:
            stages = 1 if segments * plan.tile >= max_seq_len else 2
            plan = dataclasses.replace(plan, num_segments=segments, num_stages=stages)
        return plan

    ta.plan_launch = plan_launch
print("variant segments", segments or "backend's", "merge rows", ta.MERGE_ROWS, flush=True)
from hifc.entrypoints.cli import main  # noqa: E402

sys.exit(main(sys.argv[3:]))
