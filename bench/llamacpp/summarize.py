#!/usr/bin/env python3
"""Summarize the raw lines of bench/llamacpp/run.sh into Markdown tables.

Input lines (tab-separated): engine variant mode type rows cols threads iters median_us GB/s,
from crates/quant/examples/matvec_bench.rs (engine "sluice") and mul_mat_bench.c (engine
"llama.cpp"). Each configuration is measured once per round; a cell shows the best (highest)
of the per-round median throughputs, the one least disturbed by other load on the machine.

One table for hot runs (mode plain/repack: one matrix, reused) and one for cold runs
(mode *-cold: rotating over copies larger than the last-level cache). The ratio columns divide
our default configuration (the first "sluice" variant without "-nopf") by llama.cpp's best
placement (plain or repack, whichever is faster) of each llama.cpp CPU variant; when we were
also measured without software prefetch, the same ratio follows for that configuration.
"""

import sys
from collections import defaultdict


def main(path):
    best = defaultdict(float)
    rows_seen = []  # (type, rows, cols, threads)
    columns = {False: [], True: []}  # cold? -> [(engine, variant, mode)]
    with open(path) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            c = line.rstrip("\n").split("\t")
            if len(c) < 10 or c[6] == "-":
                continue
            engine, variant, mode, ty, nrows, ncols, threads = c[:7]
            gbps = float(c[9])
            if gbps != gbps:
                continue
            key = (ty, int(nrows), int(ncols), int(threads))
            if key not in rows_seen:
                rows_seen.append(key)
            cold = mode.endswith("-cold")
            col = (engine, variant, mode)
            if col not in columns[cold]:
                columns[cold].append(col)
            best[col + key] = max(best[col + key], gbps)

    for cold in (False, True):
        cols = columns[cold]
        if not cols:
            continue
        ours = [c for c in cols if c[0] == "sluice"]
        theirs = [c for c in cols if c[0] == "llama.cpp"]
        default = next((c for c in ours if "-nopf" not in c[1]), ours[0] if ours else None)
        llama_variants = []
        for c in theirs:
            if c[1] not in llama_variants:
                llama_variants.append(c[1])
        print(f"\n{'Cold (weights streamed from DRAM)' if cold else 'Hot (one matrix, reused; cached when it fits)'}, GB/s of weight bytes\n")
        head = ["type", "rows x cols", "thr"]
        head += [f"{'ours' if e == 'sluice' else 'llama'} {v} {m.replace('-cold', '')}" for e, v, m in ours + theirs]
        ratio_of = [default] + [c for c in ours if c != default and "-nopf" in c[1]]
        head += [
            f"{'ours' if o == default else 'ours ' + o[1]} / llama {v}" for o in ratio_of for v in llama_variants
        ]
        print("| " + " | ".join(head) + " |")
        print("|" + "|".join(["---"] * len(head)) + "|")
        for key in rows_seen:
            ty, nrows, ncols, threads = key
            vals = [best.get(c + key) for c in ours + theirs]
            if not any(vals):
                continue
            cells = [ty, f"{nrows}x{ncols}", str(threads)]
            cells += [f"{v:.1f}" if v else "-" for v in vals]
            for o in ratio_of:
                mine = best.get(o + key) if o else None
                for v in llama_variants:
                    g = max((best.get(c + key, 0.0) for c in theirs if c[1] == v), default=0.0)
                    cells.append(f"{mine / g:.2f}" if mine and g else "-")
            print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "raw.tsv")
