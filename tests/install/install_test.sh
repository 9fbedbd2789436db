#!/usr/bin/env bash
# The package as a user gets it: `cmake --install` into a temporary prefix, then
# examples/spectral_gap, a CMake project of its own, finds the package, builds against it
# and prints ring8's spectral gap, which must equal what `peertrain topology` says. Also:
# the installed package carries no -march=native (it must not force it on its users), the
# headers and the program are installed, and the modules are separate libraries.
# Usage: install_test.sh SOURCE_DIR BUILD_DIR
set -u
src=${1:?usage: install_test.sh SOURCE_DIR BUILD_DIR}
build=${2:?usage: install_test.sh SOURCE_DIR BUILD_DIR}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

prefix="$work/prefix"
cmake --install "$build" --prefix "$prefix" >"$work/install.log" 2>&1 || { cat "$work/install.log"; fail "cmake --install"; exit 1; }
for f in bin/peertrain include/peertrain/topology/spectrum.h include/peertrain/config.h \
         lib/cmake/peertrain/peertrainConfig.cmake lib/cmake/peertrain/peertrainConfigVersion.cmake; do
  [[ -e $prefix/$f ]] || fail "not installed: $f"
done
for m in core topology net comm model parallel algo train; do
  [[ -e $prefix/lib/libpeertrain_$m.a ]] || fail "no library for module $m"
done
grep -rq -- "-march" "$prefix/lib/cmake/peertrain" && fail "the installed package forces -march on its users"

cmake -S "$src/examples/spectral_gap" -B "$work/example" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release \
  >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; fail "the example does not configure"; exit 1; }
cmake --build "$work/example" -j2 >"$work/build.log" 2>&1 || { tail -30 "$work/build.log"; fail "the example does not build"; exit 1; }

cat >"$work/ring8.yaml" <<'YAML'
name: ring8
graph: {generator: ring, n: 8}
YAML
out=$("$work/example/spectral_gap" "$work/ring8.yaml") || fail "the example failed: $out"
echo "$out"
gap=$(echo "$out" | sed -n 's/.*spectral gap \([0-9.]*\).*/\1/p')
want=$("$prefix/bin/peertrain" topology inspect "$work/ring8.yaml" --format json 2>/dev/null | grep -o '"spectral_gap": [0-9.e-]*' | head -1 | sed 's/.*: //')
[[ -n $gap && -n $want ]] && awk -v a="$gap" -v b="$want" 'BEGIN { d = a - b; exit !(d < 1e-6 && d > -1e-6) }' ||
  fail "the example's gap '$gap' differs from peertrain topology's '$want'"
# A bad file is named, with the error the library gives.
"$work/example/spectral_gap" "$work/missing.yaml" 2>"$work/err" && fail "a missing file was accepted"
grep -q "error: .*missing.yaml" "$work/err" || fail "a missing file is not named: $(cat "$work/err")"

echo "install: $failures failed"
exit $((failures > 0))
