#!/usr/bin/env bash
# gVisor's runsc at RUNSC_VERSION (hack/versions.env), built once from the Go module proxy into
# $CACHE_DIR/bin/runsc-<version>/runsc and reused; the project's dockerd registers it as the OCI
# runtime `runsc` (hack/dockerd.sh). Static (CGO_ENABLED=0): runsc re-executes itself inside its
# own chroot, where a dynamically linked build finds no loader. The compiler's output goes to
# $CACHE_DIR/build-runsc.log.
#   hack/runsc.sh [build]   builds when missing, prints the binary's path on stdout
#   hack/runsc.sh path      prints the path only (builds nothing)
source "$(dirname "$0")/lib.sh"
: "${RUNSC_VERSION:?hack/versions.env must pin RUNSC_VERSION}"
RUNSC_DIR="$CACHE_DIR/bin/runsc-$RUNSC_VERSION"
RUNSC="$RUNSC_DIR/runsc"
BUILD_LOG="$CACHE_DIR/build-runsc.log"

build() {
  [[ -f $RUNSC_DIR/.complete && $(cat "$RUNSC_DIR/.complete") == "$RUNSC_VERSION" && -x $RUNSC ]] && return 0
  log "building gVisor runsc $RUNSC_VERSION (log: $BUILD_LOG)"
  rm -rf "$RUNSC_DIR"; mkdir -p "$RUNSC_DIR"
  step "go install runsc" env GOBIN="$RUNSC_DIR" CGO_ENABLED=0 go install -trimpath \
    -ldflags "-s -w -X gvisor.dev/gvisor/runsc/version.version=$RUNSC_VERSION" \
    "gvisor.dev/gvisor/runsc@$RUNSC_VERSION"
  echo "$RUNSC_VERSION" >"$RUNSC_DIR/.complete"
}

case "${1:-build}" in
  build) build; echo "$RUNSC" ;;
  path) echo "$RUNSC" ;;
  *) die "usage: $0 [build|path]" ;;
esac
