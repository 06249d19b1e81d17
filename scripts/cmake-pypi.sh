# Shared by the scripts that build llama.cpp-based tools (source it, then call
# `cmake_find DIR`).
#
# After the call, CMAKE is the cmake to run: the one on PATH, else one installed from PyPI
# (the `cmake` wheel) into DIR/cmake, whose Python package PYTHONPATH then includes.

cmake_find() {
    local dir=$1
    CMAKE=$(command -v cmake || true)
    if [ -z "$CMAKE" ]; then
        echo "# cmake not found: installing it from PyPI into $dir/cmake" >&2
        python3 -m pip install --quiet --only-binary :all: --target "$dir/cmake" cmake >&2
        CMAKE="$dir/cmake/bin/cmake"
        export PYTHONPATH="$dir/cmake${PYTHONPATH:+:$PYTHONPATH}"
    fi
}
