# Shared by the scripts that need llama.cpp built for aarch64 (source it, then call
# `llamacpp_aarch64_build TARGETS...`).
#
# llama.cpp's ARM CPU backend is not among the npm package's prebuilt libraries, so it is built
# here from the source the same package ships (node-llama-cpp 3.21.1: llama.cpp release v0.4.0,
# the version of every x86 reference), with the aarch64 cross compilers of the Debian root of
# scripts/aarch64.sh, and run under qemu-aarch64 as a Cortex-A76.
#
# The build: GGML_NATIVE off and -march=armv8.2-a+dotprod+fp16 (GGML_CPU_ARM_ARCH), the
# feature level of the emulated core: NEON, the int8 dot product and FP16 arithmetic, no SVE and
# no I8MM. With that feature set ggml's ARM code takes its NEON + dotprod kernels, and its
# repacked layouts are the 4x4 (Q4_0, IQ4_NL, MXFP4, Q8_0) and 8x4 (Q4_K, Q5_K, Q6_K) ones.
# No OpenMP (ggml's own threads), shared libraries, nothing but the libraries built.
#
# After the call:
#   LLAMACPP_AARCH64_BUILD  the build directory as the root sees it (/llama-aarch64/build),
#                           libraries under bin/ (ggml) and bin/ (llama)
#   LLAMACPP_AARCH64_SRC    the source directory as the root sees it (/llama-aarch64/src)
#   LLAMACPP_AARCH64_ARCH   the -march string

LLAMACPP_AARCH64_ARCH=armv8.2-a+dotprod+fp16

llamacpp_aarch64_build() {
    local here
    here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
    local dir=${SLUICE_AARCH64:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice/aarch64}
    local npm=${XDG_CACHE_HOME:-$HOME/.cache}/sluice/llamacpp-npm
    bash "$here/aarch64.sh" setup
    bash "$here/aarch64.sh" apt cmake make g++-aarch64-linux-gnu
    # shellcheck source=llamacpp-npm.sh
    . "$here/llamacpp-npm.sh"
    llamacpp_npm_install "$npm"
    local src=$dir/root/llama-aarch64/src
    if [ ! -f "$src/CMakeLists.txt" ]; then
        rm -rf "$src"
        mkdir -p "$src"
        git -C "$npm/llama-src" archive HEAD | tar -x -C "$src"
    fi
    LLAMACPP_AARCH64_SRC=/llama-aarch64/src
    LLAMACPP_AARCH64_BUILD=/llama-aarch64/build
    echo "# building llama.cpp v0.4.0 for aarch64 ($LLAMACPP_AARCH64_ARCH): $*" >&2
    bash "$here/aarch64.sh" sh "
        set -e
        cmake -S $LLAMACPP_AARCH64_SRC -B $LLAMACPP_AARCH64_BUILD -DCMAKE_BUILD_TYPE=Release \
            -DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR=aarch64 \
            -DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc -DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++ \
            -DGGML_NATIVE=OFF -DGGML_CPU_ARM_ARCH=$LLAMACPP_AARCH64_ARCH -DGGML_OPENMP=OFF \
            -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
            -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF > /dev/null
        cmake --build $LLAMACPP_AARCH64_BUILD -j 2 --target $* > /dev/null
    "
}

# llamacpp_aarch64_generate GENERATOR OUT [CFLAGS...]: build scripts/GENERATOR.c (a reference
# generator taking its output path as its one argument) against the aarch64 ggml libraries and
# run it under qemu-aarch64, writing OUT (a path inside the checkout: the root sees only it).
llamacpp_aarch64_generate() {
    local gen=$1 out=$2
    shift 2
    local here root rel
    here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
    root=$(cd "$here/.." && pwd)
    out=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")
    case "$out" in
        "$root"/*) rel=${out#"$root"/} ;;
        *) echo "error: $out is outside the checkout (the root sees only the checkout)" >&2; return 2 ;;
    esac
    llamacpp_aarch64_build ggml
    local b=$LLAMACPP_AARCH64_BUILD/bin
    bash "$here/aarch64.sh" sh "
        set -e
        mkdir -p /llama-aarch64/refs
        aarch64-linux-gnu-gcc -O2 -std=c11 -Wall -Wextra $* -o /llama-aarch64/refs/$gen \
            /src/scripts/$gen.c -I/src/scripts -I$LLAMACPP_AARCH64_SRC/ggml/include \
            $b/libggml.so $b/libggml-cpu.so $b/libggml-base.so -Wl,-rpath,$b -lm
        qemu-aarch64 /llama-aarch64/refs/$gen /src/$rel
    "
    echo "wrote $out"
}
