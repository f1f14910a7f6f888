"""``hifc generate``: one-shot generation from the command line."""
from __future__ import annotations

import argparse
import sys

from hifc.config import add_engine_args, engine_config_from_args


def register(subparsers) -> None:
    p = subparsers.add_parser("generate", help="generate text for one or more prompts")
    p.add_argument("--prompt", action="append", required=True,
                   help="prompt text (repeat for a batch)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--chat", action="store_true", help="apply the model's chat template")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    add_engine_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hifc.engine.llm import LLM
    from hifc.sampling_params import SamplingParams

    # What can be checked without the model is checked before the engine creates any file.
    if not args.chat and not all(args.prompt):
        raise ValueError("--prompt must not be empty")
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                            top_p=args.top_p, top_k=args.top_k, stop=tuple(args.stop))
    config = engine_config_from_args(args)
    llm = LLM(**config.options())
    try:
        outputs = _generate(llm, args, params)
    except BaseException:
        _close_after_failure(llm)
        raise
    for prompt, out in zip(args.prompt, outputs):
        if len(outputs) > 1:
            print(f"--- prompt: {prompt!r} (finish: {out.finish_reason})")
        print(out.text)
    stats = llm.stats()
    llm.close()
    if config.tier.enabled:
        print(f"[hifc] preemptions {stats['preemptions']}, swapped out {stats['swap_out_blocks']} "
              f"blocks ({stats['tier_bytes_written']} B) and in {stats['swap_in_blocks']} blocks, "
              f"recomputed {stats['recomputed_sequences']}", file=sys.stderr)
    return 0


def _generate(llm, args: argparse.Namespace, params) -> list:
    if args.chat:
        convs = [[{"role": "user", "content": p}] for p in args.prompt]
        return llm.chat(convs, params, use_tqdm=not args.no_progress)
    return llm.generate(args.prompt, params, use_tqdm=not args.no_progress)


def _close_after_failure(llm) -> None:
    """Close the engine and delete the flash cache file if this run created it."""
    llm.close()
    tier = llm.engine.tier
    if tier is not None and tier.kind == "flash":
        tier.cache_file.discard()
