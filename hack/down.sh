#!/usr/bin/env bash
# `make down`: stops what `make up` and `make demo` started (the demo's sandboxd and operator,
# control plane, dockerd, PostgreSQL) and nothing else. Caches (built binaries, images) stay.
source "$(dirname "$0")/lib.sh"
"$HACK_DIR/demo.sh" stop
"$HACK_DIR/control-plane.sh" stop
"$HACK_DIR/dockerd.sh" stop
"$HACK_DIR/postgres.sh" stop
