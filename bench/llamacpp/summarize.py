#!/usr/bin/env python3
"""Summarize the raw lines of bench/llamacpp/run.sh into a Markdown table.

Input lines (tab-separated): engine isa/variant mode type rows cols threads iters median_us GB/s.
Each configuration is measured once per round; the table shows the best (highest) of the
per-round median throughputs, which is the least disturbed by other load on the machine.
"""

import sys
from collections import defaultdict


def main(path):
    best = defaultdict(float)  # (engine, variant, mode, type, rows, cols, threads) -> GB/s
    order = []  # (type, rows, cols, threads) in first-seen order
    variants = []  # llama.cpp (variant, mode) columns in first-seen order
    ours_isa = None
    with open(path) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            cols = line.rstrip("\n").split("\t")
            if len(cols) < 10 or cols[6] == "-":
                continue
            engine, variant, mode, ty, rows, ncols, threads = cols[:7]
            gbps = float(cols[9])
            if gbps != gbps:  # nan
                continue
            key = (ty, int(rows), int(ncols), int(threads))
            if key not in order:
                order.append(key)
            if engine == "llama.cpp" and (variant, mode) not in variants:
                variants.append((variant, mode))
            if engine != "llama.cpp":
                ours_isa = variant
            k = (engine, variant, mode) + key
            best[k] = max(best[k], gbps)

    head = ["type", "rows x cols", "thr", f"ours ({ours_isa})"]
    head += [f"llama {v} {m}" for v, m in variants]
    by_variant = sorted({v for v, _ in variants})
    head += [f"ours / llama {v}" for v in by_variant]
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join(["---"] * len(head)) + "|")
    for ty, rows, ncols, threads in order:
        ours = best.get(("sluice", ours_isa, "plain", ty, rows, ncols, threads))
        cells = [ty, f"{rows}x{ncols}", str(threads), f"{ours:.1f}" if ours else "-"]
        for v, m in variants:
            g = best.get(("llama.cpp", v, m, ty, rows, ncols, threads))
            cells.append(f"{g:.1f}" if g else "-")
        for v in by_variant:
            # llama.cpp's best placement for this variant (repack when it helps).
            g = max(
                (best.get(("llama.cpp", v, m, ty, rows, ncols, threads), 0.0) for vv, m in variants if vv == v),
                default=0.0,
            )
            cells.append(f"{ours / g:.2f}" if ours and g else "-")
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "raw.tsv")
