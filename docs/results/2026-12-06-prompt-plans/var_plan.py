"""var_plan.py base|best|ROWS/TILE/WARPS/STAGES BEST.json cli-args...: the paged kernel's
prompt-chunk plans (128-row q blocks) replaced by the probe's best plan (``best``: the variant
with the least geometric mean in BEST.json) or the one named, then the CLI; ``base`` changes
nothing."""
import dataclasses
import json
import sys

from hifc.layers import triton_attention

choice = sys.argv[1]
if choice != "base":
    if choice == "best":
        scores = json.load(open(sys.argv[2]))["scores"]
        choice = min(scores, key=scores.get)
    if choice != "backend":
        rows, tile, warps, stages = (int(x.rstrip("ws")) for x in choice.split("/"))
        orig_plan = triton_attention.plan_launch

        def plan_launch(max_query_len, *args, **kw):
            plan = orig_plan(max_query_len, *args, **kw)
            if max_query_len > 1 and plan.block_m == 128 and plan.tile == 128:
                group = plan.block_m // plan.block_q
                plan = dataclasses.replace(plan, block_m=rows, block_q=rows // group, tile=tile,
                                           num_warps=warps, num_stages=stages)
            return plan
        triton_attention.plan_launch = plan_launch
    print(f"prompt plan: {choice}", flush=True)
sys.argv = ["hifc"] + sys.argv[3:]
from hifc.entrypoints.cli import main  # noqa: E402

sys.exit(main())
