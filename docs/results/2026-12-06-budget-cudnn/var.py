"""var.py KEY=VALUE[;...] cli-args...: module switches over the working tree's hifc, then the
CLI. dense_max=N sets dense_attention.DENSE_PREFILL_MAX_SEQS; dplan=T,S,W,ST
forces decode plans of drows=LO,HI rows (16-1024) under 8,192 keys; 'base' changes nothing."""
import sys

from hifc.layers import dense_attention

opts = dict(p.split("=", 1) for p in sys.argv[1].split(";") if p != "base")
if "dense_max" in opts:
    dense_attention.DENSE_PREFILL_MAX_SEQS = int(opts["dense_max"])
if "dplan" in opts:  # tile,segments,warps,stages for uncrowded even-split decode plans, 16+ rows
    import dataclasses

    from hifc.layers import triton_attention
    tile, segs, warps, stages = (int(x) for x in opts["dplan"].split(","))
    lo, hi = (int(x) for x in opts.get("drows", "16,1024").split(","))
    orig_plan = triton_attention.plan_launch

    def plan_launch(max_query_len, max_seq_len, num_seqs, *args, **kw):
        plan = orig_plan(max_query_len, max_seq_len, num_seqs, *args, **kw)
        if (max_query_len == 1 and lo <= num_seqs <= hi and plan.segment_tiles == 1
                and max_seq_len <= 2 * triton_attention.BALANCED_SEGMENT_KEYS):
            plan = dataclasses.replace(plan, tile=tile, num_segments=segs, num_warps=warps,
                                       num_stages=stages)
        return plan
    triton_attention.plan_launch = plan_launch
sys.argv = ["hifc"] + sys.argv[2:]
from hifc.entrypoints.cli import main  # noqa: E402

sys.exit(main())
