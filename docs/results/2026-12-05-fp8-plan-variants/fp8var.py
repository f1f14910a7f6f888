"""Decode launch-plan variants of a float8 cache, measured in the engine: plan_launch patched
for decode plans (max_query_len 1), then bench kernels."""
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
    if variant == "stages3" and p.num_stages == 2:
        p = dataclasses.replace(p, num_stages=3)
    elif variant == "warps2":
        p = dataclasses.replace(p, num_warps=2)
    elif variant == "warps8":
        p = dataclasses.replace(p, num_warps=8)
    elif variant == "seg2x" and even and p.num_segments < 64:
        p = dataclasses.replace(p, num_segments=2 * p.num_segments)
    elif variant == "tile128" and p.tile == 64:
        p = dataclasses.replace(p, tile=128, segment_tiles=max(1, p.segment_tiles // 2))
    elif variant == "tile32" and p.tile == 64:
        p = dataclasses.replace(p, tile=32, segment_tiles=p.segment_tiles * 2 if p.segment_tiles > 1 else 1)
    return p


ta.plan_launch = patched
from hifc.entrypoints.cli import main  # noqa: E402

sys.exit(main(["bench", "kernels", *sys.argv[2:]]))
