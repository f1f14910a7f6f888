"""Decode launch-plan variants measured in the engine: plan_launch patched for decode plans
(max_query_len 1), then a hifc CLI command (argv after the variant)."""
import dataclasses
import sys

from hifc.layers import triton_attention as ta

variant = sys.argv[1]
base = ta.plan_launch


def patched(max_query_len, max_seq_len, num_seqs, *args, **kw):
    p = base(max_query_len, max_seq_len, num_seqs, *args, **kw)
    if max_query_len != 1:
        return p
    even = p.segment_tiles == 1 and p.num_segments > 1
    if variant in ("seg2x", "seg4x") and even and p.num_segments < 64:
        p = dataclasses.replace(p, num_segments=min(64, p.num_segments * (2 if variant == "seg2x" else 4)))
    elif variant == "warps2":
        p = dataclasses.replace(p, num_warps=2)
    return p


ta.plan_launch = patched
from hifc.entrypoints.cli import main  # noqa: E402

sys.exit(main(sys.argv[2:]))
