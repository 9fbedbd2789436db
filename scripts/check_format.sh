#!/usr/bin/env bash
# Checks that the lines a change touched follow .clang-format (older lines are left as
# they are: reformatting the whole tree would bury every real change in a diff).
# Usage: scripts/check_format.sh [BASE]   (BASE: the commit to compare with; default
# HEAD~1, the last commit, which is what CI checks in its fresh clone). Prints the changes
# clang-format wants and exits 1, or says the change is clean.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
base=${1:-HEAD~1}
command -v git-clang-format >/dev/null || { echo "error: check_format: git-clang-format is missing (apt-get install clang-format)" >&2; exit 2; }
if ! git rev-parse --verify -q "$base^{commit}" >/dev/null; then
  echo "check_format: no commit '$base' to compare with (a clone of one commit?); nothing to check"
  exit 0
fi
out=$(git clang-format --quiet --diff --extensions cpp,h,cu "$base" -- src include tests kernels bench examples 2>&1 || true)
if [[ -z $out || $out == *"no modified files to format"* || $out == *"did not modify any files"* ]]; then
  echo "check_format: the lines changed since $(git rev-parse --short "$base") follow .clang-format"
  exit 0
fi
echo "$out"
echo "error: check_format: the lines above, changed since $(git rev-parse --short "$base"), do not follow .clang-format (fix: git clang-format $base)" >&2
exit 1
