#!/bin/sh
# Runs every fuzz target one after the other (one core at a time), each for
# $SECS seconds (default 600), in fork mode so that a crash is recorded under
# fuzz/artifacts/<target>/ and fuzzing goes on. Logs: $LOGS/<target>.log.
# Usage: fuzz/run-all.sh [target...]   (see docs/reliability.md)
set -u
cd "$(dirname "$0")"
SECS=${SECS:-600}
LOGS=${LOGS:-/tmp/fuzz-logs}
mkdir -p "$LOGS"
TARGETS=${*:-protocol config trace_csv trace_alibaba trace_sacct}
export RUSTC_BOOTSTRAP=1
cargo fuzz build -s none -a --release || exit 1
for t in $TARGETS; do
    mkdir -p "corpus/$t" "artifacts/$t"
    nice -n 10 cargo fuzz run -s none -a --release "$t" "corpus/$t" "seeds/$t" -- \
        -max_total_time="$SECS" -fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 \
        -timeout=10 -rss_limit_mb=2048 -max_len=8192 -print_final_stats=1 \
        >"$LOGS/$t.log" 2>&1
    echo "$t: exit $?" >>"$LOGS/summary.txt"
done
