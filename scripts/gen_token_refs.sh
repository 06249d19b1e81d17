#!/usr/bin/env bash
# Regenerate crates/text/tests/fixtures/tokens/<vocab>.json: token ids, detokenized text and
# token pieces computed by llama.cpp's own tokenizer for the strings of
# crates/text/tests/fixtures/corpus.json, over every fixture vocabulary whose
# tokenizer.ggml.model is gpt2, llama or gemma4 (scripts/gen_token_refs.c does the work,
# this script hex-encodes the corpus for it and turns its output into compact JSON).
#
# Needs: the text fixtures (bash scripts/fetch_text_fixtures.sh), npm (Node 18+), git, a C
# compiler and python3. libllama comes prebuilt from the npm package
# node-llama-cpp 3.21.1 (llama.cpp release v0.4.0, linux-x64, built on Ubuntu 22.04), see
# scripts/llamacpp-npm.sh; the tokenizer does not depend on the CPU features.
#
# Usage (from anywhere):
#     scripts/gen_token_refs.sh [DIR]
# reads DIR/corpus.json and writes DIR/tokens/*.json (DIR defaults to
# crates/text/tests/fixtures; another DIR with a bigger corpus is for exploring, see
# SLUICE_TOKEN_REFS in crates/text/tests/llamacpp_refs.rs).
# Environment: LLAMACPP_NPM_DIR reuses an existing install directory of the npm package
# (default: a temporary directory, downloading about 80 MB); N_RANDOM sets the number of random
# id sequences per vocabulary (default 20); VOCABS (a shell pattern, default *) limits the
# vocabularies and ALL_PIECES=1 records the pieces of every id, both for exploring;
# SLUICE_FIXTURES as for fetch_text_fixtures.sh.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$root/crates/text/tests/fixtures}
dir=$(cd "$dir" && pwd)
corpus=$dir/corpus.json
out=$dir/tokens
mkdir -p "$out"
vocab_dir=${SLUICE_FIXTURES:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice/fixtures}/text/vocab
if [ ! -d "$vocab_dir" ]; then
    echo "gen_token_refs: no $vocab_dir: run bash scripts/fetch_text_fixtures.sh first" >&2
    exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
npm_dir=${LLAMACPP_NPM_DIR:-$work/npm}

# shellcheck source=llamacpp-npm.sh
. "$root/scripts/llamacpp-npm.sh"
llamacpp_npm_install "$npm_dir"
# shellcheck disable=SC2086 # LLAMACPP_INC holds two -I flags
cc -O2 -std=c11 -Wall -Wextra -Wno-unused-function -I"$root/scripts" -o "$work/gen_token_refs" \
    "$root/scripts/gen_token_refs.c" $LLAMACPP_INC \
    "$LLAMACPP_LIB/libllama.v0.4.0.so" "$LLAMACPP_LIB/libggml.v0.4.0.so" \
    "$LLAMACPP_LIB/libggml-base.so" -Wl,-rpath,"$LLAMACPP_LIB"

python3 - "$corpus" "$work/corpus.hex" <<'PY'
import json, sys
strings = json.load(open(sys.argv[1], encoding="utf-8"))
with open(sys.argv[2], "w") as f:
    for s in strings:
        f.write(s.encode("utf-8").hex() + "\n")
PY

# The vocabularies to cover: every fixture whose tokenizer model llama.cpp tokenizes with
# the BPE or SentencePiece code (gpt2, llama, gemma4).
python3 - "$vocab_dir" > "$work/vocabs" <<'PY'
import glob, os, struct, sys

def tokenizer_model(path):
    """The string value of tokenizer.ggml.model, read from the GGUF key-value section."""
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    with open(path, "rb") as f:
        def read(fmt):
            return struct.unpack("<" + fmt, f.read(struct.calcsize("<" + fmt)))
        def string():
            (n,) = read("Q")
            return f.read(n)
        def skip(vtype):
            if vtype == 8:
                string()
            elif vtype == 9:
                etype, count = read("IQ")
                if etype in sizes:
                    f.seek(sizes[etype] * count, 1)
                else:
                    for _ in range(count):
                        skip(etype)
            else:
                f.seek(sizes[vtype], 1)
        magic, _version, _n_tensors, n_kv = read("4sIQQ")
        assert magic == b"GGUF", path
        for _ in range(n_kv):
            key = string()
            (vtype,) = read("I")
            if key == b"tokenizer.ggml.model" and vtype == 8:
                return string().decode()
            skip(vtype)
    return None

for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.gguf"))):
    if tokenizer_model(path) in ("gpt2", "llama", "gemma4"):
        print(os.path.basename(path))
PY

if [ -z "${VOCABS:-}" ]; then
    rm -f "$out"/*.json
fi
while read -r name; do
    # shellcheck disable=SC2053 # VOCABS is a pattern
    [[ ${name%.gguf} == ${VOCABS:-*} ]] || continue
    "$work/gen_token_refs" "$vocab_dir/$name" "$work/corpus.hex" "${N_RANDOM:-20}" \
        "${ALL_PIECES:-0}" > "$work/raw.txt"
    python3 - "$work/raw.txt" "$vocab_dir/$name" "$corpus" "$out/${name%.gguf}.json" <<'PY'
import hashlib, json, os, sys

raw, vocab_path, corpus_path, out_path = sys.argv[1:]

def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()

def ids(field):
    return [] if field == "-" else [int(x) for x in field.split(",")]

def hexs(field):
    return "" if field == "-" else field

n_corpus = len(json.load(open(corpus_path, encoding="utf-8")))
encode = [[None] * 4 for _ in range(n_corpus)]
detok = [[None] * 4 for _ in range(n_corpus)]
random, pieces = [], []
header = None
for line in open(raw):
    f = line.split()
    if f[0] == "V":
        header = {"n_vocab": int(f[1]), "vocab_type": int(f[2])}
    elif f[0] == "E":
        encode[int(f[1])][2 * int(f[2]) + int(f[3])] = ids(f[4])
    elif f[0] == "D":
        detok[int(f[1])][2 * int(f[2]) + int(f[3])] = hexs(f[4])
    elif f[0] == "R":
        random.append({"ids": ids(f[2]), "detok": [hexs(x) for x in f[3:7]],
                       "retok": None if f[7] == "!" else ids(f[7])})
    elif f[0] == "P":
        pieces.append([int(f[1]), hexs(f[2]), hexs(f[3])])
    else:
        raise SystemExit(f"unexpected line {line!r}")
assert header is not None
assert all(None not in e for e in encode) and all(None not in d for d in detok)

head = {
    "tool": "llama.cpp release v0.4.0 (libllama prebuilt in the npm package node-llama-cpp 3.21.1)",
    "generator": "scripts/gen_token_refs.sh",
    "vocab": os.path.basename(vocab_path),
    "vocab_sha256": sha256(vocab_path),
    "corpus_sha256": sha256(corpus_path),
    **header,
    "layout": {
        "encode": "per corpus string: ids of llama_tokenize with (add_special, parse_special) = "
                  "(0,0), (0,1), (1,0), (1,1)",
        "detokenize": "per corpus string: hex bytes of llama_detokenize of the (1,1) ids with "
                      "(remove_special, unparse_special) = (0,0), (0,1), (1,0), (1,1)",
        "random": "seeded id sequences: hex of llama_detokenize with (remove_special, "
                  "unparse_special) = (0,0), (0,1), (1,0), (1,1), and the ids of "
                  "llama_tokenize(the (0,1) text, 0, 1), null when that text is not valid UTF-8",
        "pieces": "[id, hex of llama_token_to_piece(id, lstrip 0, special 0), same with special 1]",
    },
}
dump = lambda v: json.dumps(v, separators=(",", ":"), ensure_ascii=True)
lines = ["{"]
for k, v in head.items():
    lines.append(f"{dump(k)}:{dump(v)},")
lines.append('"encode":[')
lines.append(",\n".join(dump(e) for e in encode))
lines.append('],"detokenize":[')
lines.append(",\n".join(dump(d) for d in detok))
lines.append('],"random":[')
lines.append(",\n".join(dump(r) for r in random))
lines.append('],"pieces":[')
lines.append(",\n".join(dump(p) for p in pieces))
lines.append("]}")
text = "\n".join(lines) + "\n"
json.loads(text)
with open(out_path, "w") as f:
    f.write(text)
PY
    echo "wrote $out/${name%.gguf}.json" >&2
done < "$work/vocabs"
