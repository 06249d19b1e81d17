"""One markdown row of routing locality from `sluice analyze route --json` (docs/moefy.md).

Usage: python3 scripts/route_locality_row.py ROUTE.json LABEL TRACE.csv
       python3 scripts/route_locality_row.py --header
(TRACE.csv: the route trace ROUTE.json was made from, for the experts each layer used.)
"""
import json
import sys

if sys.argv[1] == "--header":
    print("| routing | steps | E | K | previous-token hit | chance (K/E) | static-hot hit "
          "| reuse distance 1 | distance ≤ 4 | working set, 16 steps | fewest experts a layer used |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    sys.exit(0)
d = json.load(open(sys.argv[1]))
e, k = d["n_expert"], d["n_expert_used"]
p = d["predictability"]
buckets = {b["distance"]: b["share_pct"] for b in d["reuse_distance"]["buckets"]}
near = sum(buckets.get(x, 0.0) for x in ("1", "2", "3", "4"))
ws = next(w for w in d["working_set"] if w["window"] == 16)
pairs = d["n_layer"] * e
used = {}
with open(sys.argv[3]) as f:
    header = None
    for line in f:
        if line.startswith("#"):
            continue
        cols = line.rstrip("\n").split(",")
        if header is None:
            header = {c: i for i, c in enumerate(cols)}
            continue
        used.setdefault(int(cols[header["layer"]]), set()).add(int(cols[header["expert"]]))
fewest = min(len(v) for v in used.values())
print(f"| {sys.argv[2]} | {d['steps']} | {e} | {k} | {p['previous_token']['pct']:.1f}% "
      f"| {100 * k / e:.1f}% | {p['static_hot']['pct']:.1f}% | {buckets.get('1', 0.0):.1f}% "
      f"| {near:.1f}% | {100 * ws['mean_pairs'] / pairs:.1f}% of the experts | {fewest} of {e} |")
