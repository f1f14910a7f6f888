"""The host's time per decode step, apart from the model: the engine's phases on a tiny
random-weight model (whose forward costs next to nothing on a GPU, so these phases set its
step rate there), and the packing of a padded decode step's inputs.

    PYTHONPATH=$PWD python3 scripts/cpu_host_costs.py [--batch-sizes 64,256] [--no-packing]
        [--output-kind final_only|delta|cumulative] [--json OUT]

1. Phases: ``random:tiny-llama`` on the CPU (one torch thread) with SmolLM2's tokenizer for
   detokenizing, ``--batch-sizes`` requests of 20 prompt tokens and ``--max-tokens`` greedy
   tokens each (EOS ignored), asynchronous scheduling, through ``LLM.generate`` or (streamed
   kinds) the engine stepped as a server steps it; one warm-up generate, then
   ``--repeats`` timed ones. Medians and means in ms per step (the mean counts work done in
   a request's last step, such as a text decoded at the end) of the scheduler's ``schedule``,
   the engine's ``_update`` (its ``scheduler.update`` inside), ``launch_sampling`` and
   ``step``, and a digest of the texts (to compare code versions: run the script with another
   ``hifc`` first on ``PYTHONPATH``).
2. Packing: ``write_decode_inputs`` for decodes of several (rows, context) shapes, writing
   every block table whole (with the copies of the tables the scheduler made before) against
   keeping the rows (``TableRows``), timed in the same run; the ratio (``--no-packing``: not
   run, for code before ``TableRows``).
"""
from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import statistics
import sys
import timeit
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_step_phases import Recorder  # noqa: E402

from hifc import LLM, SamplingParams  # noqa: E402
from hifc.core.scheduler_output import ScheduledSeq  # noqa: E402
from hifc.engine.gc_heap import frozen_heap  # noqa: E402
from hifc.loader import Tokenizer, smollm2_gguf_path  # noqa: E402
from hifc.runtime import inputs  # noqa: E402
from hifc.sampling_params import RequestOutputKind  # noqa: E402

PHASES = ("schedule", "update", "scheduler.update", "launch_sampling", "step")
REQUEST_IDS = itertools.count()
PACK_SHAPES = ((64, 1024), (256, 1024), (64, 8192), (128, 4096))  # (rows, context tokens)


def generate(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> list[str]:
    """The texts, through ``LLM.generate`` (final-only outputs) or, for streamed kinds, by
    stepping the engine and joining each request's deltas (as a server does)."""
    if params.output_kind is RequestOutputKind.FINAL_ONLY:
        return [o.outputs[0].text for o in llm.generate(
            [{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)]
    engine, texts = llm.engine, {}
    delta = params.output_kind is RequestOutputKind.DELTA
    for prompt in prompts:
        request_id = f"host-{next(REQUEST_IDS)}"
        texts[request_id] = ""
        engine.add_request(request_id, prompt, params)
    with frozen_heap(collect=False):  # as in LLM.generate and the server
        while engine.has_unfinished_requests():
            for out in engine.step():
                text = out.outputs[0].text if out.outputs else ""
                texts[out.request_id] = texts[out.request_id] + text if delta else text
    return list(texts.values())


def step_phases(batch: int, max_tokens: int, repeats: int,
                kind: RequestOutputKind = RequestOutputKind.FINAL_ONLY) -> dict:
    llm = LLM("random:tiny-llama", device="cpu", dtype="float32", max_num_seqs=batch,
              async_scheduling=True, kv_cache_gib=0.5)
    engine = llm.engine
    engine.tokenizer = Tokenizer.from_gguf(smollm2_gguf_path())
    rec = Recorder(cuda=False)
    engine.swaps.schedule = rec.timed("schedule", engine.swaps.schedule)
    engine._update = rec.timed("update", engine._update)
    engine.scheduler.update = rec.timed("scheduler.update", engine.scheduler.update)
    engine.runner.launch_sampling = rec.timed("launch_sampling", engine.runner.launch_sampling)
    engine.step = rec.timed("step", engine.step)
    prompts = [[(7 * i + j) % 500 + 3 for j in range(20)] for i in range(batch)]
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True,
                            output_kind=kind)
    generate(llm, prompts, params)
    rec.on = True
    for _ in range(repeats):
        texts = generate(llm, prompts, params)
    rec.on = False
    llm.close()
    text = "\x00".join(texts)
    return {"median_ms": {name: statistics.median(rec.host[name]) for name in PHASES},
            "mean_ms": {name: statistics.fmean(rec.host[name]) for name in PHASES},
            "texts": hashlib.sha256(text.encode()).hexdigest()[:12], "chars": len(text)}


def packing(rows: int, context: int, number: int = 200, block_size: int = 16) -> dict:
    layout = inputs.DecodeInputLayout(max(rows, 256), 8192 // block_size)
    num_blocks = context // block_size
    tables = [list(range(i * num_blocks, (i + 1) * num_blocks)) for i in range(rows)]
    params = SamplingParams()
    work = [ScheduledSeq(f"r{i}", [5], context - 1, tables[i], params) for i in range(rows)]
    buffer = np.zeros(layout.numel, dtype=np.int32)

    def whole():
        copies = [list(t) for t in tables]  # what the scheduler handed the runner before
        inputs.write_decode_inputs(work, rows, block_size, layout, buffer)
        return copies

    kept = inputs.TableRows(layout.max_batch)
    inputs.write_decode_inputs(work, rows, block_size, layout, buffer, kept)
    whole_ms = timeit.timeit(whole, number=number) / number * 1e3
    kept_ms = timeit.timeit(lambda: inputs.write_decode_inputs(work, rows, block_size, layout,
                                                               buffer, kept),
                            number=number) / number * 1e3
    return {"rows": rows, "context": context, "whole_ms": whole_ms, "kept_ms": kept_ms,
            "ratio": whole_ms / kept_ms}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch-sizes", default="64,256")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--output-kind", default="final_only",
                    choices=[k.name.lower() for k in RequestOutputKind],
                    help="final_only: LLM.generate; delta or cumulative: the engine stepped "
                         "as a server steps it")
    ap.add_argument("--packing", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    try:
        batches = [int(b) for b in args.batch_sizes.split(",")]
    except ValueError:
        ap.error("--batch-sizes must be comma-separated integers")
    if min(batches) < 1 or args.max_tokens < 1 or args.repeats < 1:
        ap.error("--batch-sizes, --max-tokens and --repeats must be positive")
    torch.set_num_threads(1)
    report = {"phases": {}, "packing": []}
    for batch in batches:
        result = report["phases"][batch] = step_phases(
            batch, args.max_tokens, args.repeats, RequestOutputKind[args.output_kind.upper()])
        print(f"{batch} requests x {args.max_tokens} tokens, {args.output_kind}: "
              f"texts {result['texts']}")
        for name, ms in result["median_ms"].items():
            print(f"  {name:16} median {ms:7.3f}  mean {result['mean_ms'][name]:7.3f} ms per step")
    if args.packing:
        print("packing a decode step (ms): rows x context, whole tables, kept rows, ratio")
    for rows, context in PACK_SHAPES if args.packing else ():
        p = packing(rows, context)
        report["packing"].append(p)
        print(f"  {rows:4d} x {context:5d}  {p['whole_ms']:.3f}  {p['kept_ms']:.3f}  "
              f"{p['ratio']:.1f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
