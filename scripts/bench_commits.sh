#!/usr/bin/env bash
# One benchmark command against the engine of two commits, taking turns, so that the host's
# drift lands on both alike (on a 2-vCPU VM the same cell moves 10-30 % from one minute to the
# next). Both run this checkout's benchmarks/ (copied into a worktree of BEFORE, so the
# measuring code is the same), each with the package of its own tree; AFTER is this checkout.
#
#   bash scripts/bench_commits.sh BEFORE ROUNDS OUTDIR NAME -- python -m benchmarks.X [args]
#
# Round r writes OUTDIR/NAME-{before,after}-r.md and passes `--json OUTDIR/NAME-...-r.json`;
# `python -m benchmarks.commits_report OUTDIR NAME` pairs them (spec_ledger, bench_eagle).
set -euo pipefail
if [ $# -lt 6 ] || [ "$5" != "--" ]; then
  sed -n '2,10p' "$0" >&2
  exit 2
fi
before=$1 rounds=$2 out=$3 name=$4
shift 5
here=$(git rev-parse --show-toplevel)
tree=$(mktemp -d /tmp/bench-before.XXXXXX)
cleanup() { git -C "$here" worktree remove --force "$tree" >/dev/null 2>&1 || true; }
trap cleanup EXIT
git -C "$here" worktree add --detach "$tree" "$before" >/dev/null
rm -rf "$tree/benchmarks" && cp -r "$here/benchmarks" "$tree/benchmarks"
mkdir -p "$out"
out=$(cd "$out" && pwd)
for r in $(seq 1 "$rounds"); do
  for side in before after; do
    dir=$here
    [ "$side" = before ] && dir=$tree
    (cd "$dir" && "$@" --json "$out/$name-$side-$r.json" >"$out/$name-$side-$r.md" 2>&1)
    echo "$name $side $r done $(date -u +%T)"
  done
done
