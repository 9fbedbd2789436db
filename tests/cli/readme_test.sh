#!/usr/bin/env bash
# Every runnable command of the README, as written, so that a renamed flag or file fails the
# suite. Each ```sh block of README.md runs as one bash script in a scratch folder that holds
# the tree's topology/, examples/ and scripts/, with `build/peertrain` standing for a wrapper
# that keeps training short: `launch` gets --max-steps 3 --eval-every 3 after the README's
# own flags (the last value of a flag wins), a Python program under `launch --` gets its own
# short form, and a --dashboard port becomes a free one. A block after the line
#   <!-- readme-test: skip, REASON -->
# is not run here; REASON names the test that runs it (the set-up scripts, the experiments'
# tiny form, the install test, the two-host netlab test).
# Usage: readme_test.sh SOURCE_DIR BUILD_DIR   (about 2 minutes on 2 cores)
set -u
src=$(realpath "${1:?usage: readme_test.sh SOURCE_DIR BUILD_DIR}")
build=$(realpath "${2:?usage: readme_test.sh SOURCE_DIR BUILD_DIR}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

mkdir -p "$work/run/build" "$work/blocks"
for d in topology examples scripts; do ln -s "$src/$d" "$work/run/$d"; done
ln -s "$build/python" "$work/run/build/python"
cat >"$work/run/build/peertrain" <<WRAPPER
#!/usr/bin/env bash
# build/peertrain as the README calls it, with training cut short.
real="$build/peertrain"
if [[ \${1:-} != launch ]]; then exec "\$real" "\$@"; fi
ours=() program=()
seen_dashes=0
for a in "\$@"; do
  if ((seen_dashes)); then program+=("\$a"); elif [[ \$a == -- ]]; then seen_dashes=1; else ours+=("\$a"); fi
done
for ((i = 0; i < \${#ours[@]}; ++i)); do
  [[ \${ours[i]} == --dashboard ]] && ours[i+1]=\$((20000 + RANDOM % 20000))
done
if ((seen_dashes)); then
  case "\${program[*]}" in
    *neighbor_average.py*) program+=(--steps 3 --size 1000) ;;
    *torch_dpsgd.py*) program+=(--epochs 1 --limit 256) ;;
  esac
  exec "\$real" "\${ours[@]}" -- "\${program[@]}"
fi
exec "\$real" "\${ours[@]}" --max-steps 3 --eval-every 3
WRAPPER
chmod +x "$work/run/build/peertrain"

# Split the README into its ```sh blocks, each with the skip line before it, if any.
/usr/bin/python3 - "$src/README.md" "$work/blocks" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
n = 0
for m in re.finditer(r"(<!-- readme-test: skip[^>]*-->\s*\n)?```sh\n(.*?)```", text, re.S):
    n += 1
    name = f"{sys.argv[2]}/{n:02d}" + (".skip" if m.group(1) else ".sh")
    open(name, "w").write(m.group(2))
print(f"{n} sh blocks in README.md")
PY
ran=0 skipped=0
for block in "$work"/blocks/*; do
  if [[ $block == *.skip ]]; then skipped=$((skipped + 1)); continue; fi
  ran=$((ran + 1))
  started=$SECONDS
  if ! (cd "$work/run" && timeout 600 bash -e "$block" >"$block.log" 2>&1); then
    fail "README block $(basename "$block" .sh) failed:"
    sed 's/^/    /' "$block"
    tail -15 "$block.log" | sed 's/^/  | /'
  else
    echo "block $(basename "$block" .sh): $(head -1 "$block" | cut -c1-70)... ran in $((SECONDS - started)) s"
  fi
done
((ran > 0)) || fail "no runnable sh block found in README.md"
((failures == 0)) && echo "README: $ran sh blocks ran, $skipped skipped (run by their own tests)"
exit $((failures > 0))
