# Shared by the scripts that need llama.cpp's prebuilt libraries (source it, then call
# `llamacpp_npm_install DIR`).
#
# llama.cpp comes from the npm registry: node-llama-cpp 3.21.1 ships prebuilt linux-x64
# libraries of llama.cpp release v0.4.0 (one CPU backend library per x86 feature level, built
# on Ubuntu 22.04) and the matching llama.cpp source as a git bundle, from which only the
# headers are taken. Needs npm (Node 18+) and git; downloads about 80 MB on first use.
#
# After the call:
#   LLAMACPP_LIB  the directory of libggml-base.so, libggml-cpu-<level>.so, libllama...
#   LLAMACPP_INC  "-I<dir>/llama-src/include -I<dir>/llama-src/ggml/include"

LLAMACPP_NPM_VERSION=3.21.1

llamacpp_npm_install() {
    local dir=$1
    mkdir -p "$dir"
    if [ ! -d "$dir/node_modules/@node-llama-cpp/linux-x64" ]; then
        echo "# installing node-llama-cpp $LLAMACPP_NPM_VERSION prebuilt libraries into $dir" >&2
        (
            cd "$dir"
            [ -f package.json ] || npm init -y >/dev/null
            npm install --silent -E --ignore-scripts --omit=optional \
                "node-llama-cpp@$LLAMACPP_NPM_VERSION" \
                "@node-llama-cpp/linux-x64@$LLAMACPP_NPM_VERSION" >&2
        )
    fi
    if [ ! -d "$dir/llama-src/ggml/include" ]; then
        rm -rf "$dir/llama-src"
        git -c init.defaultBranch=main clone -q --no-checkout \
            "$dir/node_modules/node-llama-cpp/llama/gitRelease.bundle" "$dir/llama-src"
        git -C "$dir/llama-src" checkout -q HEAD -- include ggml/include
    fi
    LLAMACPP_LIB="$dir/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64"
    LLAMACPP_INC="-I$dir/llama-src/include -I$dir/llama-src/ggml/include"
}
