#!/usr/bin/env bash
# Executed aarch64 instructions of sluice's NEON dot kernels and activation quantizers against
# llama.cpp's ARM kernels, counted exactly (deterministically) by qemu; prints a markdown table.
#
# Both sides run under qemu-aarch64 -cpu cortex-a76 (Armv8.2-A, NEON + dotprod + FP16, no SVE,
# no I8MM) inside the Debian root of scripts/aarch64.sh: llama.cpp release v0.4.0 built for
# -march=armv8.2-a+dotprod+fp16 (scripts/llamacpp-aarch64.sh), probed by
# scripts/arm_insn_probe.c through ggml_get_type_traits_cpu(t)->vec_dot / ->from_float (the
# plain vec_dot path with one activation row, not the repacked gemv), and sluice's
# Kernels::detect() table (the NEON one), probed by crates/quant/examples/arm_insn_probe.rs.
# Both read the same inputs (written by `arm_insn_probe gen`) and must agree on a checksum of
# their results.
#
# Counting: qemu runs the probe with one guest instruction per translation block and logs
# every executed block (-one-insn-per-tb -d exec,nochain) together with the system calls
# (-d strace), into a pipe. The probes bracket each measurement with getppid() calls; awk
# counts the logged instructions between them. Per item, (count of 3 operations - count of 1
# operation) / 2 is one operation (marker and warm-up effects cancel): a matvec of ROWS = 64
# weight rows of 4096 elements against one activation row (reported per row), or the
# quantization of one activation row of 4096 values; and a whole product (activation
# quantization included) of the 64 x 4096 weight, repacked as llama.cpp's ARM build loads it,
# with 1 and with 4 activation rows: llama.cpp's graph (CPU_REPACK buffer, gemv / gemm, one
# thread) against sluice's matvec_with / matmul_with in the order Kernels::order_for gives (the
# multi-row and multi-token kernels). The counts do not depend on the host CPU.
#
# Usage (from anywhere; needs root or password-less sudo, as scripts/aarch64.sh does):
#     bash scripts/arm_insn_counts.sh
# SLUICE_AARCH64_TARGET (a path inside the root, default /target-aarch64) is the cargo build
# directory of the Rust probe. About 3 minutes after the builds.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
target=${SLUICE_AARCH64_TARGET:-/target-aarch64}

# shellcheck source=llamacpp-aarch64.sh
. "$root/scripts/llamacpp-aarch64.sh"
llamacpp_aarch64_build ggml ggml-cpu
b=$LLAMACPP_AARCH64_BUILD/bin
inc="-I$LLAMACPP_AARCH64_SRC/ggml/include"

echo "# building crates/quant/examples/arm_insn_probe.rs for aarch64" >&2
SLUICE_AARCH64_TARGET=$target bash "$root/scripts/aarch64.sh" cargo build --locked --release \
    -q -p quant --example arm_insn_probe >&2

echo "# counting executed instructions under qemu-aarch64 -cpu cortex-a76" >&2
bash "$root/scripts/aarch64.sh" sh "
    set -e
    w=/arm-insn
    rm -rf \$w && mkdir -p \$w/data
    aarch64-linux-gnu-gcc -O2 -std=c11 -Wall -Wextra -Werror -o \$w/probe_c \
        /src/scripts/arm_insn_probe.c -I/src/scripts $inc $b/libggml.so $b/libggml-cpu.so $b/libggml-base.so \
        -Wl,-rpath,$b
    qemu-aarch64 -cpu cortex-a76 \$w/probe_c gen \$w/data
    rust=$target/aarch64-unknown-linux-gnu/release/examples/arm_insn_probe

    # count SIDE PROGRAM ARGS...: the program's stdout in \$w/SIDE.out, the instruction counts
    # between its markers in \$w/SIDE.seg (one number a line; the first: everything before the
    # first marker)
    count() {
        side=\$1
        shift
        mkfifo \$w/\$side.fifo
        awk '/^Trace / { n++; next } / getppid\\(/ { print n; n = 0 } END { print n }' \
            < \$w/\$side.fifo > \$w/\$side.seg &
        qemu-aarch64 -cpu cortex-a76 -one-insn-per-tb -d exec,nochain,strace \
            -D \$w/\$side.fifo \"\$@\" > \$w/\$side.out
        wait
        rm -f \$w/\$side.fifo
    }
    count c \$w/probe_c count \$w/data &
    count rust \$rust \$w/data
    wait
    grep -q '^kernel table: neon\$' \$w/rust.out || {
        echo 'the Rust probe did not pick the NEON kernel table:' >&2; cat \$w/rust.out >&2; exit 1; }
    grep -E '^(dot|quant|mm|checksum) ' \$w/c.out > \$w/c.items
    grep -E '^(dot|quant|mm|checksum) ' \$w/rust.out > \$w/rust.items
    cmp -s \$w/c.items \$w/rust.items || {
        echo 'the probes differ in their items or results (checksum):' >&2
        diff \$w/c.items \$w/rust.items >&2 || true; exit 1; }
    grep -E '^(dot|quant|mm) ' \$w/c.items > \$w/items
    for side in c rust; do
        sed '1d;\$d' \$w/\$side.seg | paste -d' ' - - - | awk '{ printf \"%.1f\\n\", (\$3 - \$2) / 2 }' \
            > \$w/\$side.per_op
    done
    paste -d' ' \$w/items \$w/c.per_op \$w/rust.per_op > \$w/counts
" > /dev/null

chroot_dir=${SLUICE_AARCH64:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice/aarch64}/root
counts=$chroot_dir/arm-insn/counts
[ -s "$counts" ] || { echo "error: no counts in $counts" >&2; exit 1; }

# Bytes of one row of 4096 elements (weights) and the tables; the last one converts the counts
# to weight GB/s for a phone-class core (Cortex-A76 class at 2.8 GHz sustaining 3 to 4
# instructions per cycle, an assumption: an estimate from counts, not a timing).
awk -v GHZ=2.8 '
function row_bytes(t) {
    if (t == "q4_0" || t == "iq4_nl") return 128 * 18
    if (t == "q4_1") return 128 * 20
    if (t == "q5_0") return 128 * 22
    if (t == "q5_1") return 128 * 24
    if (t == "q8_0") return 128 * 34
    if (t == "mxfp4") return 128 * 17
    if (t == "q2_K") return 16 * 84
    if (t == "q3_K") return 16 * 110
    if (t == "q4_K") return 16 * 144
    if (t == "q5_K") return 16 * 176
    if (t == "q6_K") return 16 * 210
    if (t == "iq4_xs") return 16 * 136
    if (t == "tq1_0") return 16 * 54
    if (t == "tq2_0") return 16 * 66
    if (t == "iq2_xxs") return 16 * 66
    if (t == "iq2_xs") return 16 * 74
    if (t == "iq2_s") return 16 * 82
    if (t == "iq3_xxs") return 16 * 98
    if (t == "iq3_s") return 16 * 110
    if (t == "iq1_s") return 16 * 50
    if (t == "iq1_m") return 16 * 56
    if (t == "f16" || t == "bf16") return 4096 * 2
    if (t == "f32") return 4096 * 4
    return 0
}
BEGIN {
    print "| weight type | bytes/row | llama.cpp insns/row | ours insns/row | llama.cpp insns/byte | ours insns/byte | ours / llama.cpp |"
    print "|---|---:|---:|---:|---:|---:|---:|"
}
$1 == "dot" {
    rb = row_bytes($2); c = $3 / 64; r = $4 / 64
    printf "| %s | %d | %.1f | %.1f | %.3f | %.3f | %.3f |\n", $2, rb, c, r, c / rb, r / rb, r / c
}
$1 == "quant" { q[++nq] = $0 }
$1 == "mm" { m[++nm] = $0 }
$1 == "dot" { d[++nd] = $0 }
END {
    # An estimate from the counts, not a timing: weight bytes per second a core retiring
    # IPC instructions per cycle at GHZ would reach if nothing else (memory) limited it.
    print ""
    printf "| weight type | llama.cpp GB/s (est.) | ours GB/s (est.) |\n"
    print "|---|---:|---:|"
    for (i = 1; i <= nd; i++) {
        split(d[i], f, " ")
        rb = row_bytes(f[2]); c = f[3] / 64 / rb; r = f[4] / 64 / rb
        printf "| %s | %.1f-%.1f | %.1f-%.1f |\n", f[2], GHZ * 3 / c, GHZ * 4 / c, GHZ * 3 / r, GHZ * 4 / r
    }
    print ""
    print "| repacked product (64 rows x 4096) | tokens | llama.cpp insns/row/token | ours insns/row/token | llama.cpp insns/byte/token | ours insns/byte/token | ours / llama.cpp |"
    print "|---|---:|---:|---:|---:|---:|---:|"
    for (i = 1; i <= nm; i++) {
        split(m[i], f, " ")
        rb = row_bytes(f[2]); c = f[4] / 64 / f[3]; r = f[5] / 64 / f[3]
        printf "| %s | %d | %.1f | %.1f | %.3f | %.3f | %.3f |\n", f[2], f[3], c, r, c / rb, r / rb, r / c
    }
    print ""
    print "| activation quantization (one row of 4096 f32) | llama.cpp insns/row | ours insns/row | llama.cpp insns/element | ours insns/element | ours / llama.cpp |"
    print "|---|---:|---:|---:|---:|---:|"
    for (i = 1; i <= nq; i++) {
        split(q[i], f, " ")
        printf "| %s | %d | %d | %.3f | %.3f | %.3f |\n", f[2], f[3], f[4], f[3] / 4096, f[4] / 4096, f[4] / f[3]
    }
}' "$counts"
