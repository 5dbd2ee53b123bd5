#!/usr/bin/env bash
# Prepares the build: obtains the crates.io package cubecl-cuda 0.11.3, checks
# its checksum, and applies our diff (third_party/cubecl-cuda-0.11.3.patch)
# into third_party/patched/cubecl-cuda, which the workspace's [patch.crates-io]
# points at. Why: cubecl-cuda 0.11.3 always depends on cubecl-llvm, whose build
# downloads an LLVM bundle from the internet; the diff makes that dependency an
# optional feature, off, so kernels are compiled by NVRTC at run time instead.
# It also exposes the CUDA stream a resolved buffer belongs to, for cuBLASLt.
#
# Idempotent and fast when already done (a stamp records the crate checksum and
# the diff's hash). Needs cargo, sha256sum, tar and patch; network: crates.io only.
#
# Usage: bash scripts/setup.sh     (from anywhere)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
crate=cubecl-cuda
version=0.11.3
# The checksum crates.io publishes for cubecl-cuda 0.11.3 (its index entry).
checksum=dacd0c047f781b468d094705ef042f28d68944bf862c049f5cf0b7396f730bb5
diff_file="$repo/third_party/$crate-$version.patch"
dest="$repo/third_party/patched/$crate"
stamp="$dest/.ember-setup"

want="$checksum $(sha256sum "$diff_file" | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi

echo "setup: preparing patched $crate $version" >&2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Have cargo download the pristine package into its registry cache.
mkdir -p "$work/fetch/src"
: >"$work/fetch/src/lib.rs"
cat >"$work/fetch/Cargo.toml" <<TOML
[package]
name = "ember-fetch-$crate"
version = "0.0.0"
edition = "2021"
[dependencies]
$crate = { version = "=$version", default-features = false }
[workspace]
TOML
cargo fetch --quiet --manifest-path "$work/fetch/Cargo.toml"

cargo_home=${CARGO_HOME:-$HOME/.cargo}
archive=$(find "$cargo_home/registry/cache" -name "$crate-$version.crate" -print -quit)
if [ -z "$archive" ]; then
    echo "setup: cargo fetched no $crate-$version.crate under $cargo_home/registry/cache" >&2
    exit 1
fi
got=$(sha256sum "$archive" | cut -d' ' -f1)
if [ "$got" != "$checksum" ]; then
    echo "setup: checksum mismatch for $archive: got $got, want $checksum" >&2
    exit 1
fi

tar -xzf "$archive" -C "$work"
patch --quiet -p2 -d "$work/$crate-$version" <"$diff_file"
echo "$want" >"$work/$crate-$version/.ember-setup"
rm -rf "$dest"
mkdir -p "$(dirname "$dest")"
mv "$work/$crate-$version" "$dest"
echo "setup: $crate $version patched into ${dest#"$repo"/}" >&2
