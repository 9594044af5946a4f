#!/usr/bin/env bash
# `make down`: stops what `make up` started (control plane, dockerd, PostgreSQL) and nothing else.
# Caches (built binaries, images) stay for the next `make up`.
source "$(dirname "$0")/lib.sh"
"$HACK_DIR/control-plane.sh" stop
"$HACK_DIR/dockerd.sh" stop
"$HACK_DIR/postgres.sh" stop
