#!/usr/bin/env bash
# Builds llama.cpp's own benchmark tools (llama-bench, llama-completion) from the llama.cpp tree
# that PyPI's llama-cpp-python 0.3.36 source distribution vendors (llama.cpp 0.5.0-dev), for the
# side-by-side runner (scripts/bench.sh). Once per machine: about 15 minutes on 2 cores; later
# calls print the directory at once.
#
#   bash scripts/build_llamacpp.sh            # prints the bin directory on stdout
#
# Installs into ${SLUICE_LLAMACPP:-${XDG_CACHE_HOME:-~/.cache}/sluice/llama.cpp-0.3.36}.
# Needs pip (the sdist and, when missing, cmake come from PyPI), a C++ compiler and make.
# The build is native (-march=native), as a user would build llama.cpp for their machine.
set -euo pipefail

VERSION=0.3.36
DIR=${SLUICE_LLAMACPP:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice/llama.cpp-$VERSION}
BIN="$DIR/build/bin"
if [ -x "$BIN/llama-bench" ] && [ -x "$BIN/llama-completion" ]; then
    echo "$BIN"
    exit 0
fi
mkdir -p "$DIR"
if [ ! -f "$DIR/src/CMakeLists.txt" ]; then
    echo "# downloading the llama-cpp-python $VERSION source distribution (about 76 MB)" >&2
    mkdir -p "$DIR/sdist"
    # The sdist's address and SHA-256 from PyPI's simple index (pip download would build its
    # metadata, which means building cmake from source first).
    python3 - "$VERSION" "$DIR/sdist/sdist.tar.gz" <<'PY'
import hashlib, re, sys, urllib.request
version, out = sys.argv[1], sys.argv[2]
with urllib.request.urlopen("https://pypi.org/simple/llama-cpp-python/") as r:
    page = r.read().decode()
m = re.search(r'href="([^"#]*llama_cpp_python-%s\.tar\.gz)#sha256=([0-9a-f]{64})"' % re.escape(version), page)
if not m:
    sys.exit(f"llama-cpp-python {version}: no source distribution on PyPI's simple index")
url, want = m.groups()
urllib.request.urlretrieve(url, out)
with open(out, "rb") as f:
    digest = hashlib.sha256(f.read()).hexdigest()
if digest != want:
    sys.exit(f"{out}: SHA-256 {digest} differs from PyPI's {want}")
PY
    tar -xzf "$DIR/sdist/sdist.tar.gz" -C "$DIR/sdist"
    rm -rf "$DIR/src"
    mv "$DIR/sdist/llama_cpp_python-$VERSION/vendor/llama.cpp" "$DIR/src"
    rm -rf "$DIR/sdist"
fi
# shellcheck source=cmake-pypi.sh
. "$(dirname "${BASH_SOURCE[0]}")/cmake-pypi.sh"
cmake_find "$DIR"
echo "# building llama-bench and llama-completion (about 15 min on 2 cores)" >&2
"$CMAKE" -S "$DIR/src" -B "$DIR/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF >&2
"$CMAKE" --build "$DIR/build" -j "$(nproc)" --target llama-bench llama-completion >&2
echo "$BIN"
