#!/usr/bin/env bash
# A real S3 server for the tests and the demo: versitygw (Apache-2.0, an S3 gateway over a local
# folder) at VERSITYGW_VERSION (hack/versions.env), built once from the Go module proxy into
# $CACHE_DIR/bin/versitygw-<version>/ and reused, serving $DEV_DIR/s3/data on 127.0.0.1 only, with
# the bucket $S3_BUCKET made. Idempotent: an answering server is left alone. The compiler's
# output goes to $CACHE_DIR/build-versitygw.log, the server's to $DEV_DIR/s3/versitygw.log.
#   hack/s3.sh start|stop|env|build
source "$(dirname "$0")/lib.sh"
: "${VERSITYGW_VERSION:?hack/versions.env must pin VERSITYGW_VERSION}"
S3_DIR="$CACHE_DIR/bin/versitygw-$VERSITYGW_VERSION"
S3_BIN="$S3_DIR/versitygw"
BUILD_LOG="$CACHE_DIR/build-versitygw.log"
S3_PORT="${SANDBOXD_S3_PORT:-57070}"
S3_HOME="$DEV_DIR/s3"
S3_DATA="$S3_HOME/data"
S3_PID="$S3_HOME/versitygw.pid"
S3_LOG="$S3_HOME/versitygw.log"
S3_BUCKET=sandboxd-test
S3_REGION=us-east-1
# Credentials of this test server alone (it listens on loopback); never a real store's.
S3_ACCESS_KEY=sandboxd-test
S3_SECRET_KEY=sandboxd-test-secret

build() {
  [[ -f $S3_DIR/.complete && $(cat "$S3_DIR/.complete") == "$VERSITYGW_VERSION" && -x $S3_BIN ]] && return 0
  log "building versitygw $VERSITYGW_VERSION (log: $BUILD_LOG)"
  rm -rf "$S3_DIR"; mkdir -p "$S3_DIR"
  step "go install versitygw" env GOBIN="$S3_DIR" go install -trimpath -ldflags "-s -w" \
    "github.com/versity/versitygw/cmd/versitygw@$VERSITYGW_VERSION"
  echo "$VERSITYGW_VERSION" >"$S3_DIR/.complete"
}

answering() { curl -s -o /dev/null "http://127.0.0.1:$S3_PORT/"; }

start() {
  build
  mkdir -p "$S3_DATA/$S3_BUCKET"
  if answering; then return 0; fi
  log "starting versitygw $VERSITYGW_VERSION on 127.0.0.1:$S3_PORT (data $S3_DATA)"
  ROOT_ACCESS_KEY="$S3_ACCESS_KEY" ROOT_SECRET_KEY="$S3_SECRET_KEY" \
    setsid "$S3_BIN" --port "127.0.0.1:$S3_PORT" --region "$S3_REGION" posix "$S3_DATA" \
    >"$S3_LOG" 2>&1 </dev/null &
  echo $! >"$S3_PID"
  WAIT_PID=$(cat "$S3_PID") wait_for "versitygw (log: $S3_LOG)" 60 answering
  log "versitygw is up: http://127.0.0.1:$S3_PORT, bucket $S3_BUCKET"
}

stop() {
  [[ -f $S3_PID ]] || return 0
  local pid; pid=$(cat "$S3_PID")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$S3_PID"
}

env_lines() {
  cat <<ENV
export SANDBOXD_S3_ENDPOINT=http://127.0.0.1:$S3_PORT
export SANDBOXD_S3_BUCKET=$S3_BUCKET
export SANDBOXD_S3_REGION=$S3_REGION
export SANDBOXD_S3_ACCESS_KEY_ID=$S3_ACCESS_KEY
export SANDBOXD_S3_SECRET_ACCESS_KEY=$S3_SECRET_KEY
ENV
}

case "${1:-start}" in
  build) build ;;
  start) start ;;
  stop) stop ;;
  env) env_lines ;;
  *) die "usage: $0 start|stop|env|build" ;;
esac
