#!/bin/sh
# Runs one fuzzer for a bounded time from the checked-in seeds (ctest, label `fuzz`).
# New inputs go to a scratch corpus in the build tree, never into the seeds; a crash, leak or
# timeout leaves its input under WORK/artifacts/ and fails the test (libFuzzer's exit code).
#   run_fuzzer.sh BINARY SEED_DIR WORK_DIR SECONDS
set -eu
bin=$1 seeds=$2 work=$3 seconds=$4
mkdir -p "$work/corpus" "$work/artifacts"
exec "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=4096 -print_final_stats=1 \
  -artifact_prefix="$work/artifacts/" "$work/corpus" "$seeds"
