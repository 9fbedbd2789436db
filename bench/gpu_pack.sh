#!/usr/bin/env bash
# Packs a CUDA build for the device machine, whose image has CUDA, cuBLAS, NCCL and PyTorch
# but none of the Debian libraries peertrain links (Boost, yaml-cpp, OpenSSL, sentencepiece,
# googletest...): the GPU programs and every library they need that is not CUDA's or the C
# library's go into .gpu/ (git ignores it through .git/info/exclude), to travel with
# `run`'s carry. Build first, portable (the device's processor is not this one):
#   cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DPEERTRAIN_NATIVE=OFF \
#         -DCMAKE_CXX_FLAGS=-march=x86-64-v3 -DPEERTRAIN_CUDA=ON
#   cmake --build build-gpu --target peertrain kernels_cuda_test device_cuda_test nccl_group_test kernels_bench
#   bench/gpu_pack.sh [BUILD_DIR]      then, with carry [".gpupack"], bench/gpu_session.sh there
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0; fi
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
# Every resolved library except the C runtime and the CUDA libraries the device has itself.
ldd "${programs[@]}" | awk '/=> \// { print $3 }' | sort -u |
  grep -Ev '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libcuda|libcudart|libcublas|libcublasLt|libnccl)\.so' |
  while read -r lib; do cp -L "$lib" "$dest/lib/"; done
strip --strip-unneeded "$dest"/* "$dest"/lib/* 2>/dev/null || true
# The GPT's default text (Debian's fortunes), which the device image lacks.
cp -r /usr/share/games/fortunes "$dest/fortunes"
# The C library too, used only where the device's is older than the one built against.
mkdir -p "$dest/glibc"
for lib in ld-linux-x86-64.so.2 libc.so.6 libm.so.6; do cp -L "/lib/x86_64-linux-gnu/$lib" "$dest/glibc/"; done
# The repository and the pack travel together under run's 64 MiB: the pack goes compressed
# (.gpupack/gpu.tar.xz, about a quarter of its size); gpu_session.sh unpacks it there.
grep -qx '/.gpupack/' "$exclude" 2>/dev/null || echo '/.gpupack/' >>"$exclude"
mkdir -p "$root/.gpupack"
tar -C "$root" -cJf "$root/.gpupack/gpu.tar.xz" .gpu
du -sh "$dest" "$root/.gpupack/gpu.tar.xz"
