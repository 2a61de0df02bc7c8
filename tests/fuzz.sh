#!/usr/bin/env bash
# Runs every fuzz target in rust/fuzz (libFuzzer via cargo-fuzz) for a
# bounded time: FUZZ_SECONDS each (default 20). cargo-fuzz needs nightly
# compiler flags; RUSTC_BOOTSTRAP=1 allows them on the stable toolchain.
# A crash leaves its input in rust/fuzz/artifacts/<target>/ and fails.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${FUZZ_SECONDS:-20}
command -v cargo-fuzz >/dev/null || cargo install -q cargo-fuzz --locked
export RUSTC_BOOTSTRAP=1
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for target in request_head response_head proxy ws_frame; do
    if cargo fuzz run --fuzz-dir rust/fuzz -s none "$target" -- \
        -max_total_time="$secs" -print_final_stats=1 >"$log" 2>&1; then
        runs=$(grep -o "stat::number_of_executed_units: *[0-9]*" "$log" | grep -o "[0-9]*$" || echo "?")
        echo "fuzz $target: ${secs}s, $runs inputs, no failure"
    else
        tail -40 "$log"
        echo "fuzz $target FAILED (input saved under rust/fuzz/artifacts/$target/)" >&2
        exit 1
    fi
done
