#!/usr/bin/env bash
# promtool at PROMETHEUS_MODULE_VERSION (hack/versions.env), built from the Go module proxy once
# (hack/build-control-plane.sh promtool) and reused. Prints its path on stdout. The tests of the
# chart's alerts (tests/tests/alerts.rs) run it.
source "$(dirname "$0")/lib.sh"
"$HACK_DIR/build-control-plane.sh" promtool >&2
echo "$PROMTOOL_BIN/promtool"
