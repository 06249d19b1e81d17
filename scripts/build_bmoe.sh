#!/usr/bin/env bash
# Builds the peer engine, BigMoeOnEdge's bmoe-cli (0.19.0, commit 2d4f2b1), on llama.cpp release
# v0.4.0 with the expert-ready hook its --overlap needs, outside the checkout, for the side-by-side
# benchmark (`sluice bench --peer bmoe`). Once per machine: about 13 minutes on 2 cores; later
# calls print the binary's path at once.
#
#   bash scripts/build_bmoe.sh            # prints the path of bmoe-cli on stdout
#
# Inputs (never copied into the repository):
#   BMOE_PEERS  the folder with BigMoeOnEdge-2d4f2b1-src.tar.gz and
#               llama.cpp-v0.4.0-expert-ready-hook.patch (default: ../shared/peers beside the
#               checkout)
# llama.cpp v0.4.0 is the git bundle npm's node-llama-cpp 3.21.1 ships (scripts/llamacpp-npm.sh).
# Installs into ${SLUICE_BMOE:-${XDG_CACHE_HOME:-~/.cache}/sluice/bmoe-2d4f2b1}. Needs npm, git,
# cmake (from PyPI when missing), a C++ compiler and make. The build is native (GGML_NATIVE=ON),
# as the peer's documentation builds it.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PEERS=${BMOE_PEERS:-$root/../shared/peers}
DIR=${SLUICE_BMOE:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice/bmoe-2d4f2b1}
BIN="$DIR/src/build/cli/bmoe-cli"
if [ -x "$BIN" ]; then
    echo "$BIN"
    exit 0
fi
tarball="$PEERS/BigMoeOnEdge-2d4f2b1-src.tar.gz"
patch="$PEERS/llama.cpp-v0.4.0-expert-ready-hook.patch"
for f in "$tarball" "$patch"; do
    [ -f "$f" ] || { echo "build_bmoe.sh: $f not found (set BMOE_PEERS to the peer folder)" >&2; exit 1; }
done
mkdir -p "$DIR"
if [ ! -f "$DIR/src/CMakeLists.txt" ]; then
    rm -rf "$DIR/src.tmp"
    mkdir -p "$DIR/src.tmp"
    tar -xzf "$tarball" -C "$DIR/src.tmp"
    mv "$DIR/src.tmp" "$DIR/src"
fi
if [ ! -f "$DIR/src/third_party/llama.cpp/CMakeLists.txt" ]; then
    # shellcheck source=llamacpp-npm.sh
    . "$root/scripts/llamacpp-npm.sh"
    llamacpp_npm_install "$DIR/npm"
    rm -rf "$DIR/src/third_party/llama.cpp"
    mkdir -p "$DIR/src/third_party"
    git -c init.defaultBranch=main clone -q \
        "$DIR/npm/node_modules/node-llama-cpp/llama/gitRelease.bundle" \
        "$DIR/src/third_party/llama.cpp"
    git -C "$DIR/src/third_party/llama.cpp" apply "$patch"
fi
# shellcheck source=cmake-pypi.sh
. "$(dirname "${BASH_SOURCE[0]}")/cmake-pypi.sh"
cmake_find "$DIR"
echo "# building bmoe-cli on llama.cpp v0.4.0 (about 13 min on 2 cores)" >&2
"$CMAKE" -S "$DIR/src" -B "$DIR/src/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DBMOE_BUILD_TESTS=OFF -DBMOE_BUILD_TOOLS=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF >&2
"$CMAKE" --build "$DIR/src/build" -j "$(nproc)" --target bmoe-cli >&2
[ -x "$BIN" ] || { echo "build_bmoe.sh: the build finished without $BIN" >&2; exit 1; }
echo "$BIN"
