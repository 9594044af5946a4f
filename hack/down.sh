#!/usr/bin/env bash
# `make down`: stops what `make up` and `make demo` started (the demo's sandboxd and operator,
# the local node and its pods, control plane, dockerd, PostgreSQL, the S3 server) and nothing else: nothing of
# them stays running or mounted. Caches (built binaries, images) stay.
source "$(dirname "$0")/lib.sh"
"$HACK_DIR/demo.sh" stop
"$HACK_DIR/node.sh" stop
"$HACK_DIR/control-plane.sh" stop
"$HACK_DIR/dockerd.sh" stop
"$HACK_DIR/postgres.sh" stop
"$HACK_DIR/s3.sh" stop
