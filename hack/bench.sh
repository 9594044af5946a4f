#!/usr/bin/env bash
# `make bench [BENCH=name]`: the benchmarks, in one place (tests/src/bin/*-bench.rs and
# tests/bench/wire_bench.py), release builds, each measuring its own baseline in the same run;
# docs/benchmarks.md records their figures and the commands below. Needs the stack (`make up`).
#   sandboxd  sandboxd's API against the same work done directly (bollard, the local disk)
#   open      one session open, end to end, at 1 and 10 at once, against a raw container start
#   operator  the operator at 1,000 sessions against the API server's own floor (no-op engine)
#   egress    time to first byte and throughput through the egress proxy against direct
#   isolation a runtime on gVisor against the same on runc: opens, runs, files, sleep and wake
#   wire      the seed's sandboxd against ours, through pydantic-ai-backend's client
#   interactive  a terminal's keystroke echo, HTTP and a stream through the ports route,
#             against sandboxd's floor and the same work inside the sandbox
#   snapshot  snapshots and restores of large and small files, and a fork to Running, against
#             tar | zstd to the same S3 store
# Without BENCH, every one runs, one after the other (about 15 minutes).
source "$(dirname "$0")/lib.sh"
eval "$("$HACK_DIR/env.sh")"
cd "$ROOT_DIR"
bin="${CARGO_TARGET_DIR:-$ROOT_DIR/target}/release"
log "bench: cargo build --release (the benches, sandboxd, sandbox-operator, test-internet)"
cargo build -q --release -p sandboxd-tests -p sandboxd -p sandboxd-operator -p sandboxd-testkit --bins

run() {
  local name="$1"
  shift
  log "bench: $name ($*)"
  "$@"
}

benches=("${1:-sandboxd open operator egress isolation wire interactive snapshot}")
for b in ${benches[*]}; do
  case "$b" in
    sandboxd) run "$b" "$bin/sandboxd-bench" --runs 200 --opens 10 --warm 40 --files 20 ;;
    open) run "$b" "$bin/open-bench" --runs 30 --concurrency 1,10 ;;
    operator) run "$b" "$bin/operator-bench" --sessions 1000 --idle-watch 5 --driver noop ;;
    egress) run "$b" "$bin/egress-bench" ;;
    isolation) run "$b" "$bin/isolation-bench" --opens 10 --warm 10 --runs 200 --files 20 --sleeps 5 ;;
    interactive) run "$b" "$bin/interactive-bench" --keys 500 --requests 300 --mib 512 ;;
    snapshot) run "$b" "$bin/snapshot-bench" --mib 1024 --files 5000 --fork-mib 100 ;;
    wire) run "$b" "$("$HACK_DIR/wire-venv.sh")" tests/bench/wire_bench.py --sandboxd "$bin/sandboxd" --opens 10 --runs 100 --files 10 ;;
    *) die "no bench '$b': BENCH is one of sandboxd, open, operator, egress, isolation, wire, interactive, snapshot" ;;
  esac
done
