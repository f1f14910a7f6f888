"""PNG figures of ``hifc bench sweep`` results (matplotlib, Agg canvas, no pyplot state)."""
from __future__ import annotations

from hifc.analysis.common import new_figure, save_figure

PANEL_LABELS = {"input_len": "input length (tokens)", "output_len": "output length (tokens)",
                "max_num_seqs": "concurrency (max_num_seqs)", "block_size": "block size (tokens)"}


def plot_sweep(sweep: dict, path: str) -> None:
    """One panel per swept quantity: output tokens/s per variant (solid, left axis) and
    preemptions per variant (dashed, right axis); the block-size sweep adds a panel with the
    raw swap I/O time per variant."""
    points = sweep["points"]
    panels = list(dict.fromkeys(p["panel"] for p in points))
    io_panel = sweep["figure"] == "block-size"
    ncols = len(panels) + io_panel
    fig = new_figure(width=5.6 * ncols, height=4.2)
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    for ax, panel in zip(axes, panels):
        panel_points = [p for p in points if p["panel"] == panel]
        _throughput_panel(ax, panel_points, sweep["compare"], panel)
        ax.set_title(_fixed_values(panel_points[0]), fontsize=9)
    if io_panel:
        tiered = [v for v in sweep["compare"] if v in ("dram", "flash", "auto")]
        _io_panel(axes[-1], points, tiered, sweep["compare"])
    s = sweep["settings"]
    budget = (f"{s['kv_cache_gib']:g} GiB" if s["kv_cache_gib"] is not None
              else f"{s['num_gpu_blocks']} blocks")
    fig.suptitle(f"{sweep['paper']}-like: {sweep['title']} — {s['model']}, "
                 f"{sweep['num_prompts']} prompts/point, KV budget {budget}", fontsize=10)
    save_figure(fig, path)


def _fixed_values(point: dict) -> str:
    """What stays fixed along a panel's x axis."""
    parts = [f"{k.replace('_len', '')} {point[k]}" for k in ("input_len", "output_len")
             if k != point["panel"]]
    parts += [f"{label} {point[k]}" for k, label in (("max_num_seqs", "max_num_seqs"),
                                                      ("block_size", "block"))
              if k != point["panel"]]
    return ", ".join(parts)


def _series(points: list[dict], variant: str, key: str) -> list[float]:
    return [next(r[key] for r in p["variants"] if r["variant"] == variant) for p in points]


def _x_axis(ax, points: list[dict], panel: str) -> list[int]:
    xs = [p["x"] for p in points]
    if panel == "block_size":
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel(PANEL_LABELS[panel])
    return xs


def _throughput_panel(ax, points: list[dict], variants: list[str], panel: str) -> None:
    xs = _x_axis(ax, points, panel)
    swaps = ax.twinx()
    for i, variant in enumerate(variants):
        color = f"C{i}"
        ax.plot(xs, _series(points, variant, "output_tokens_per_s"), marker="o", color=color,
                label=f"{variant} tok/s")
        swaps.plot(xs, _series(points, variant, "preemptions"), marker="x", linestyle="--",
                   color=color, alpha=0.7, label=f"{variant} preemptions")
    ax.set_ylabel("output tokens/s")
    ax.set_ylim(bottom=0)
    swaps.set_ylabel("preemptions (dashed)")
    swaps.set_ylim(bottom=0)
    lines = ax.get_lines() + swaps.get_lines()
    ax.legend(lines, [line.get_label() for line in lines], fontsize=7, loc="best")
    ax.grid(alpha=0.3)


def _io_panel(ax, points: list[dict], variants: list[str], all_variants: list[str]) -> None:
    xs = _x_axis(ax, points, "block_size")
    for variant in variants:  # same colour as in the throughput panel
        ax.plot(xs, _series(points, variant, "swap_io_seconds"), marker="s",
                color=f"C{all_variants.index(variant)}", label=f"{variant} swap I/O s")
    ax.set_title("raw swap I/O time", fontsize=9)
    ax.set_ylabel("swap I/O s (submission to completion, summed)")
    ax.set_ylim(bottom=0)
    if variants:
        ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
