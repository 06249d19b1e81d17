#!/usr/bin/env bash
# An aarch64 cross toolchain from Debian's package registry, and cargo run with it (tests under
# qemu-user). Phones are ARM: this is how the portable and NEON paths are built and tested on an
# x86 machine without downloads from outside the package registries.
#
#   bash scripts/aarch64.sh setup             # once per machine: about a minute, 2.7 GB on disk
#   bash scripts/aarch64.sh cargo ARGS...      # `cargo ARGS --target aarch64-unknown-linux-gnu`
#                                              # in the checkout, test binaries run by qemu-aarch64
#   bash scripts/aarch64.sh apt PACKAGES...    # install more packages into the root (the
#                                              # reference generators' C/C++ cross compilers)
#   bash scripts/aarch64.sh sh 'COMMANDS'      # a shell in the root, the checkout at /src
#
# Emulated CPU: qemu-aarch64 runs as a Cortex-A76 (QEMU_CPU, default cortex-a76): Armv8.2-A with
# the dot-product and FP16 extensions and no SVE or I8MM, the phone core the aarch64 references
# of llama.cpp were made on (scripts/gen_cpu_refs_aarch64.sh). qemu's default, `max`, would
# report every extension it emulates and so choose other kernels than a phone does.
#
# The toolchain: a minimal Debian sid root made by debootstrap, with rustc/cargo 1.97.1 and
# libstd-rust-dev:arm64 (the aarch64 standard library of that same compiler),
# gcc-aarch64-linux-gnu (the linker), libc6-dev-arm64-cross and qemu-user. It lives in
# ${SLUICE_AARCH64:-${XDG_CACHE_HOME:-~/.cache}/sluice/aarch64}, outside the checkout; `setup`
# is idempotent (a STAMP names the package set). sid's Release file in the registry this
# machine reaches is past its Valid-Until date, so apt is told not to check that date.
#
# `cargo` runs inside the root in a private mount namespace (nothing stays mounted afterwards):
# the checkout is mounted at /src, the host cargo home's registry (the crates the host build
# already fetched, so the cross build runs --offline) under /cargo-home, and the fixture
# cache at the same path as on the host; build output goes to the root's /target-aarch64 (or
# SLUICE_AARCH64_TARGET, a path inside the root, for a second build beside it).
# Needs root (debootstrap, chroot, mount), as the other set-up scripts' apt steps do; run by
# another user it goes on through password-less sudo where there is one.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DIR=${SLUICE_AARCH64:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice/aarch64}
CHROOT=$DIR/root
SUITE=sid
MIRROR=http://deb.debian.org/debian
PACKAGES="rustc cargo rust-clippy libstd-rust-dev:arm64 gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user"
STAMP_VERSION="aarch64 v1 $SUITE $PACKAGES"
FIX=${SLUICE_FIXTURES:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice/fixtures}
CARGO_HOME_HOST=${CARGO_HOME:-$HOME/.cargo}

die() {
    echo "scripts/aarch64.sh: $*" >&2
    exit 1
}

# Root from here on: as another user, fetch the crates as that user (so the cargo home stays
# theirs), then go on through password-less sudo.
if [ "$(id -u)" != 0 ]; then
    if [ "${1:-}" = cargo ]; then
        (cd "$root" && cargo fetch --locked -q)
    fi
    sudo -n true 2> /dev/null || die "needs root (debootstrap, chroot, mount) or password-less sudo"
    exec sudo -n env HOME="$HOME" PATH="$PATH" SLUICE_AARCH64="$DIR" SLUICE_FIXTURES="$FIX" \
        CARGO_HOME="$CARGO_HOME_HOST" SLUICE_AARCH64_FETCHED=1 bash "${BASH_SOURCE[0]}" "$@"
fi

setup() {
    if [ -f "$DIR/STAMP" ] && [ "$(cat "$DIR/STAMP")" = "$STAMP_VERSION" ]; then
        return 0
    fi
    if ! command -v debootstrap > /dev/null; then
        echo "# installing debootstrap from Debian's packages" >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap > /dev/null \
            || die "cannot install debootstrap (is Debian's package registry reachable?)"
    fi
    # a root made by an earlier package set only needs the packages: keep it
    if [ ! -f "$DIR/STAMP" ] || [ ! -x "$CHROOT/usr/bin/rustc" ]; then
        rm -rf "$CHROOT"
        mkdir -p "$DIR"
        echo "# debootstrap: a minimal Debian $SUITE root in $CHROOT" >&2
        debootstrap --variant=minbase "$SUITE" "$CHROOT" "$MIRROR" > "$DIR/debootstrap.log" 2>&1 \
            || die "debootstrap failed (see $DIR/debootstrap.log)"
    fi
    echo "# installing $PACKAGES" >&2
    unshare -m sh -c "
        mount -t proc proc '$CHROOT/proc'
        chroot '$CHROOT' /bin/sh -c '
            dpkg --add-architecture arm64 &&
            apt-get -o Acquire::Check-Valid-Until=false update -q &&
            DEBIAN_FRONTEND=noninteractive apt-get -o Acquire::Check-Valid-Until=false \
                install -y -q --no-install-recommends $PACKAGES'
    " > "$DIR/apt.log" 2>&1 || die "installing the toolchain failed (see $DIR/apt.log)"
    chroot "$CHROOT" rustc --version >&2
    echo "$STAMP_VERSION" > "$DIR/STAMP"
}

QEMU_CPU=${QEMU_CPU:-cortex-a76}

# Run shell commands ($1) inside the root in a private mount namespace, with the checkout at
# /src, the host cargo home's registry under /cargo-home and the fixture cache at its host path.
in_root() {
    [ -f "$DIR/STAMP" ] || die "no toolchain: run \`bash scripts/aarch64.sh setup\` first"
    mkdir -p "$CHROOT/src" "$CHROOT/cargo-home" "$CHROOT$FIX" "$FIX"
    local cmd
    cmd=$(printf '%q' "$1")
    unshare -m bash -c "
        mount -t proc proc '$CHROOT/proc'
        mount --bind '$root' '$CHROOT/src'
        mkdir -p '$CARGO_HOME_HOST/registry' '$CHROOT/cargo-home/registry'
        mount --bind '$CARGO_HOME_HOST/registry' '$CHROOT/cargo-home/registry'
        mount --bind '$FIX' '$CHROOT$FIX'
        exec chroot '$CHROOT' /usr/bin/env HOME='$HOME' SLUICE_FIXTURES='$FIX' \
            QEMU_CPU='$QEMU_CPU' QEMU_LD_PREFIX=/usr/aarch64-linux-gnu /bin/sh -c $cmd
    "
}

run_cargo() {
    # the crates the cross build needs are those of the host build: fetch them on the host
    if [ -z "${SLUICE_AARCH64_FETCHED:-}" ]; then
        (cd "$root" && cargo fetch --locked -q)
    fi
    # the subcommand first, then our options, then the caller's (which may end in `-- ...`)
    local sub=$1 args
    shift
    args=$(printf ' %q' "$@")
    in_root "cd /src &&
        export CARGO_HOME=/cargo-home CARGO_TARGET_DIR=${SLUICE_AARCH64_TARGET:-/target-aarch64} \
            CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
            CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER=qemu-aarch64 &&
        exec cargo $sub --offline --target aarch64-unknown-linux-gnu $args"
}

apt_install() {
    [ -f "$DIR/STAMP" ] || die "no toolchain: run \`bash scripts/aarch64.sh setup\` first"
    unshare -m sh -c "
        mount -t proc proc '$CHROOT/proc'
        chroot '$CHROOT' /bin/sh -c '
            DEBIAN_FRONTEND=noninteractive apt-get -o Acquire::Check-Valid-Until=false \
                install -y -q --no-install-recommends $*'
    " > "$DIR/apt-extra.log" 2>&1 || die "installing $* failed (see $DIR/apt-extra.log)"
}

case "${1:-}" in
    setup) setup ;;
    cargo)
        shift
        run_cargo "$@"
        ;;
    apt)
        shift
        apt_install "$@"
        ;;
    sh)
        [ $# = 2 ] || die "usage: bash scripts/aarch64.sh sh 'COMMANDS'"
        in_root "$2"
        ;;
    *)
        echo "usage: bash scripts/aarch64.sh setup | cargo ARGS... | apt PACKAGES... | sh 'COMMANDS'" >&2
        exit 2
        ;;
esac
