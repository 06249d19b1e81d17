"""Every lever of one model on one plot (docs/lossy.md, "Every lever on one plot"): decode speed
against the baseline (scripts/lever_speed.sh's OUT file) on x, perplexity against the baseline
(the table scripts/lossy_cache_aware.sh prints, on the same model and cache) on y, one labelled
point per setting. A setting that is exact (`--ngram`) has the baseline's perplexity by
construction and needs no row in the quality table.

Usage: python plot_levers.py SPEED.tsv QUALITY.md OUT.png TITLE
Needs matplotlib (made with 3.9.2 from PyPI).
"""

import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

EXACT = ("--ngram",)


def main():
    speed_path, quality_path, out, title = sys.argv[1:5]
    speed = {}
    with open(speed_path) as f:
        next(f)
        for line in f:
            setting, _tps, ratio, mib, _hit = line.rstrip("\n").split("\t")
            speed[setting] = (float(ratio), float(mib))
    quality = {"baseline": 1.0}
    for line in open(quality_path):
        m = re.match(r"\| `([^`]+)` \| [0-9.]+ \| ×([0-9.]+) \|", line)
        if m:
            quality[m.group(1)] = float(m.group(2))
    fig, ax = plt.subplots(figsize=(9, 6), dpi=120)
    points = []
    for setting, (ratio, mib) in speed.items():
        exact = setting == "baseline" or setting.startswith(EXACT)
        if exact:
            ppl = 1.0
        elif setting in quality:
            ppl = quality[setting]
        else:
            sys.exit(f"no perplexity for {setting!r} in {quality_path}")
        points.append((ratio, ppl, setting, mib, exact))
    # Points near the baseline's perplexity crowd together: their labels are stacked above
    # them, each joined to its point by a line.
    crowded = sorted((p for p in points if p[1] < 1.5), key=lambda p: p[0])
    stack = {p[2]: k for k, p in enumerate(crowded)}
    for ratio, ppl, setting, mib, exact in points:
        kind = "exact" if exact else "lossy"
        ax.scatter(ratio, ppl, s=60, marker="o" if exact else "s",
                   color="tab:green" if exact else "tab:red", label=kind, zorder=3)
        text = f"{setting}  ({mib:.1f} MiB/token)"
        if setting in stack:
            ax.annotate(text, (ratio, ppl), fontsize=7, xytext=(8, 14 + 13 * stack[setting]),
                        textcoords="offset points",
                        arrowprops=dict(arrowstyle="-", color="grey", linewidth=0.5))
        else:
            ax.annotate(text, (ratio, ppl), fontsize=7, xytext=(6, 4),
                        textcoords="offset points")
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), loc="upper left")
    ax.set_yscale("log")
    ax.axhline(1.0, color="grey", linewidth=0.5)
    ax.axvline(1.0, color="grey", linewidth=0.5)
    ax.set_xlabel("decode tok/s ÷ baseline (median of per-round ratios)")
    ax.set_ylabel("held-out perplexity ÷ baseline (stepped, log scale)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out)


if __name__ == "__main__":
    main()
