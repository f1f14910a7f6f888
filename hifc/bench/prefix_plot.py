"""The PNG of ``hifc bench prefix``: TTFT p50/p99 and throughput per variant, per workload."""
from __future__ import annotations

from hifc.analysis.common import new_figure, save_figure


def plot_prefix(summary: dict, path: str) -> None:
    """One column per workload: TTFT p50 and p99 bars per variant (top), output tokens/s per
    variant (bottom); flash hit and read rates written over the bars."""
    results = summary["results"]
    fig = new_figure(width=5.2 * len(results), height=6.4)
    axes = fig.subplots(2, len(results), squeeze=False)
    for col, (workload, result) in enumerate(results.items()):
        rows = result["variants"]
        names = [r["variant"] for r in rows]
        xs = range(len(rows))
        ttft = axes[0][col]
        ttft.bar([x - 0.2 for x in xs], [r["ttft_p50_s"] for r in rows], 0.4, label="p50")
        ttft.bar([x + 0.2 for x in xs], [r["ttft_p99_s"] for r in rows], 0.4, label="p99")
        ttft.set_xticks(list(xs), names)
        ttft.set_ylabel("TTFT (s)")
        ttft.set_title(f"{workload}: {result['workload']['requests']} requests", fontsize=9)
        ttft.legend(fontsize=8)
        tput = axes[1][col]
        tput.bar(list(xs), [r["output_tokens_per_s"] for r in rows], 0.6, color="tab:green")
        tput.set_xticks(list(xs), names)
        tput.set_ylabel("output tokens/s")
        for x, r in zip(xs, rows):
            tput.annotate(f"gpu {r['gpu_hit_rate']:.2f}\nflash {r['flash_hit_rate']:.2f}"
                          f"\nread {r['flash_read_rate']:.2f}", (x, r["output_tokens_per_s"]),
                          ha="center", va="top", fontsize=7)
    s = summary["settings"]
    fig.suptitle(f"prefix caching — {s['model']}, block {s['block_size']}, "
                 f"{summary['kv_bytes_per_token']} KV bytes/token", fontsize=10)
    save_figure(fig, path)
