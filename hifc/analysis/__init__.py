"""Torch-free analysis models of the HiFC paper, each a `hifc` subcommand.

    cost        memory-expansion TCO (DRAM vs flash)            hifc.analysis.cost.register
    endurance   pSLC TBW and lifetime from daily KV writes      hifc.analysis.endurance.register
    stall       stall budget: T_swap against T_gap              hifc.analysis.stall.register
    wafsim      FTL simulator: WAF of a tier block trace        hifc.analysis.wafsim.register

Each `register(subparsers)` adds its parser to the top-level `hifc` subparsers and sets
`func(args) -> exit code`; `register_all` adds all four.
"""

from __future__ import annotations


def register_all(subparsers) -> None:
    from hifc.analysis import cost, endurance, stall, wafsim

    for module in (cost, endurance, stall, wafsim):
        module.register(subparsers)
