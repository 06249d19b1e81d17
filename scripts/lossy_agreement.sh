#!/usr/bin/env bash
# Next-token agreement of a lossy setting with the baseline (docs/lossy.md): the logits of every
# position of the held-out text (scripts/fetch_eval_texts.sh, its first CHARS characters) under
# the model as it is and under each `--n-expert-used K`, and for each K the share of positions
# whose most likely next token is the baseline's.
#
# Usage: bash scripts/lossy_agreement.sh MODEL.gguf K...
# Environment: CHARS (default 6000), PYTHON (a python with numpy; default: the fixture venv's).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[ $# -ge 2 ] || { echo "usage: $0 MODEL.gguf K..." >&2; exit 2; }
model=$1
shift
chars=${CHARS:-6000}
python=${PYTHON:-${SLUICE_FIXTURES:-$HOME/.cache/sluice/fixtures}/venv/bin/python}
"$python" -c 'import numpy' 2>/dev/null || { echo "error: $python has no numpy (PYTHON=...)" >&2; exit 1; }
texts=$(bash "$root/scripts/fetch_eval_texts.sh")
text=$(head -c "$chars" "$texts/heldout-sotu-1961-kennedy.txt")
cargo build --release --quiet --manifest-path "$root/Cargo.toml"
sluice=$root/target/release/sluice
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$sluice" logits -m "$model" -p "$text" --out "$work/base.npy" 2> /dev/null
echo "| --n-expert-used | positions | next token as the baseline's |"
echo "|---:|---:|---:|"
for k in "$@"; do
    "$sluice" logits -m "$model" -p "$text" --n-expert-used "$k" --out "$work/k.npy" 2> /dev/null
    "$python" - "$work/base.npy" "$work/k.npy" "$k" <<'PY'
import sys
import numpy as np
a = np.load(sys.argv[1], mmap_mode="r").argmax(axis=1)
b = np.load(sys.argv[2], mmap_mode="r").argmax(axis=1)
print(f"| {sys.argv[3]} | {len(a)} | {100.0 * (a == b).mean():.1f}% |")
PY
done
