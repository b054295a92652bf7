#!/usr/bin/env bash
# Bounded fuzzing of QTensor.from_bytes / from_parts / the binding (atheris, a dev tool):
#   pip install atheris && tests/fuzz/run.sh [seconds, default 60] [extra libFuzzer flags]
# Crashing inputs land in tests/fuzz/crashes/ (replayed by tests/test_fuzz_regressions.py).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
secs="${1:-60}"
shift || true
corpus="$(mktemp -d)"
trap 'rm -rf "$corpus"' EXIT
python "$here/fuzz_bytes.py" --write-seeds "$corpus"
mkdir -p "$here/crashes"
python "$here/fuzz_bytes.py" -max_total_time="$secs" -artifact_prefix="$here/crashes/" \
    -print_final_stats=1 -timeout=30 -rss_limit_mb=4096 "$@" "$corpus"
