#!/bin/sh
# usage: run_fuzz.sh FUZZER SEED_DIR SECONDS
# Fuzzes on a scratch copy of the seed corpus for a bounded time; a crash or
# sanitizer report fails (libFuzzer exits non-zero and saves the input).
set -eu
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$2"/* "$work"/
exec "$1" -max_total_time="$3" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix="${MESON_BUILD_ROOT:-.}/" "$work"
