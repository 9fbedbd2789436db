#!/usr/bin/env bash
# Packs a CUDA build to run on a GPU machine that has the NVIDIA driver, CUDA, cuBLAS, NCCL
# and PyTorch but none of the Debian libraries peertrain links (Boost, yaml-cpp, OpenSSL,
# sentencepiece, googletest...). Into .gpu/ (which git ignores, through .git/info/exclude)
# go the GPU programs, every library they need other than CUDA's and the C runtime's,
# Debian's fortunes (the GPT's default text) and a copy of the C library (used only where
# the GPU machine's is older). The same goes xz-compressed, about a quarter of the size,
# into .gpupack/gpu.tar.xz, so that the repository and the programs copied over together
# stay under 64 MiB, the most a copy to the GPU machine may carry; bench/gpu_checks.sh
# unpacks it there.
# Build first, portable (the GPU machine's processor may not be this one):
#   cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DPEERTRAIN_NATIVE=OFF \
#         -DCMAKE_CXX_FLAGS=-march=x86-64-v3 -DPEERTRAIN_CUDA=ON
#   cmake --build build-gpu --target peertrain kernels_cuda_test device_cuda_test nccl_group_test kernels_bench
#   bench/gpu_bundle.sh [BUILD_DIR]      (default build-gpu)
# then copy the repository with .gpupack/ (or .gpu/) to the GPU machine and run
# bench/gpu_checks.sh there.
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0; fi
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-gpu}
dest=$root/.gpu
exclude=$(git -C "$root" rev-parse --git-path info/exclude)  # .git may be a file (a worktree)
[[ $exclude == /* ]] || exclude=$root/$exclude
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >>"$exclude"
rm -rf "$dest"
mkdir -p "$dest/lib"
programs=("$build/peertrain" "$build/tests/kernels_cuda_test" "$build/tests/device_cuda_test" "$build/tests/nccl_group_test"
  "$build/bench/kernels_bench")
for p in "${programs[@]}"; do
  [[ -x $p ]] || { echo "error: $p is not built" >&2; exit 1; }
  cp "$p" "$dest/"
done
# Every resolved library except the C runtime and the CUDA libraries the GPU machine has itself.
ldd "${programs[@]}" | awk '/=> \// { print $3 }' | sort -u |
  grep -Ev '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libcuda|libcudart|libcublas|libcublasLt|libnccl)\.so' |
  while read -r lib; do cp -L "$lib" "$dest/lib/"; done
strip --strip-unneeded "$dest"/* "$dest"/lib/* 2>/dev/null || true
# The GPT's default text (Debian's fortunes), which a machine without Debian's packages lacks.
cp -r /usr/share/games/fortunes "$dest/fortunes"
# The C library too, used only where the GPU machine's is older than the one built against.
mkdir -p "$dest/glibc"
for lib in ld-linux-x86-64.so.2 libc.so.6 libm.so.6; do cp -L "/lib/x86_64-linux-gnu/$lib" "$dest/glibc/"; done
# Compressed, so that the repository and the programs copied together stay under 64 MiB;
# bench/gpu_checks.sh unpacks it on the GPU machine.
grep -qx '/.gpupack/' "$exclude" 2>/dev/null || echo '/.gpupack/' >>"$exclude"
mkdir -p "$root/.gpupack"
tar -C "$root" -cJf "$root/.gpupack/gpu.tar.xz" .gpu
du -sh "$dest" "$root/.gpupack/gpu.tar.xz"
