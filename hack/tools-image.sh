#!/usr/bin/env bash
# Builds the tools image of the tests ($TOOLS_IMAGE_TAG): the local base image ($BASE_IMAGE_TAG)
# with curl, dig (dnsutils), python3 (with requests and httpx), openssl and ca-certificates, the clients a test runs in a sandbox
# against the test internet (testkit's internet module). Nothing is pulled and the build has no
# network: the packages and their dependencies the base image lacks are fetched with this
# machine's apt (same suite as the base image) and installed with dpkg in a classic build, as
# hack/images.sh does. Reused when present; prints the tag. Its output goes to
# $CACHE_DIR/tools-image.log.
source "$(dirname "$0")/lib.sh"
export DOCKER_HOST="${DOCKER_HOST:-unix://$DEV_DIR/docker.sock}"
export DOCKER_BUILDKIT=0 # the classic builder: no buildx here, and nothing to pull
BUILD_LOG="$CACHE_DIR/tools-image.log"
PACKAGES=(curl dnsutils python3 ca-certificates python3-requests python3-httpx openssl)

if docker image inspect "$TOOLS_IMAGE_TAG" >/dev/null 2>&1; then echo "$TOOLS_IMAGE_TAG"; exit 0; fi
docker image inspect "$BASE_IMAGE_TAG" >/dev/null 2>&1 || die "base image $BASE_IMAGE_TAG is missing: run \`make up\`"
log "building $TOOLS_IMAGE_TAG: $BASE_IMAGE_TAG with ${PACKAGES[*]} (log: $BUILD_LOG)"
stage="$(mktemp -d "${TMPDIR:-/tmp}/tools-image.XXXXXX")"
trap 'rm -rf "$stage"' EXIT

# The packages to add, and in which order, as apt would install them into the base image: apt
# simulates the install against the base image's dpkg status (so the first of alternatives, and
# the pre-dependencies configured before what needs them); the Inst and Conf steps of its plan
# become `dpkg --unpack` and `dpkg --configure` steps in the build.
docker run --rm --network none "$BASE_IMAGE_TAG" cat /var/lib/dpkg/status >"$stage/status"
simulate() {
  apt-get -s -o Dir::State::status="$stage/status" install --no-install-recommends "${PACKAGES[@]}"
}
plan="$(simulate 2>>"$BUILD_LOG")" || {
  log "apt-get cannot plan the install; updating the package lists"
  apt-get update -qq >>"$BUILD_LOG" 2>&1
  plan="$(simulate 2>>"$BUILD_LOG")" || die "apt-get cannot plan ${PACKAGES[*]} on $BASE_IMAGE_TAG; see $BUILD_LOG"
}
printf '%s\n' "$plan" >>"$BUILD_LOG"
grep -q '^Remv ' <<<"$plan" && die "installing ${PACKAGES[*]} would remove packages of $BASE_IMAGE_TAG; see $BUILD_LOG"
# Inst NAME [OLD] (VERSION ...): NAME=VERSION, the exact versions apt chose.
mapfile -t debs < <(awk '$1 == "Inst" { v = ($3 ~ /^\[/) ? $4 : $3; sub(/^\(/, "", v); print $2 "=" v }' <<<"$plan")
((${#debs[@]})) || die "the base image has ${PACKAGES[*]} already: nothing to add"
mkdir -p "$stage/debs"
download() { (cd "$stage/debs" && apt-get download "${debs[@]}"); }
download >>"$BUILD_LOG" 2>&1 || {
  log "apt-get download failed; updating the package lists"
  apt-get update -qq >>"$BUILD_LOG" 2>&1
  rm -f "$stage"/debs/*.deb
  download >>"$BUILD_LOG" 2>&1 || die "cannot download ${debs[*]} (Debian's mirror); see $BUILD_LOG"
}
# apt's plan as dpkg steps, consecutive steps of a kind in one call.
awk '
  function flush() { if (kind != "") print cmd; kind = ""; cmd = "" }
  $1 == "Inst" || $1 == "Conf" {
    if ($1 != kind) { flush(); kind = $1; cmd = (kind == "Inst") ? "dpkg --unpack" : "dpkg --configure" }
    cmd = cmd " " ((kind == "Inst") ? "/tmp/debs/" $2 "_*.deb" : $2)
  }
  END { flush() }
' <<<"$plan" | { echo "set -eux"; cat; echo "dpkg --configure -a"; } >"$stage/debs/install.sh"

cat >"$stage/Dockerfile" <<'DOCKERFILE'
# The tests' tools image: clients for the test internet. Built by hack/tools-image.sh.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
COPY debs/ /tmp/debs/
RUN DEBIAN_FRONTEND=noninteractive sh /tmp/debs/install.sh && rm -rf /tmp/debs \
    && curl --version && dig -v && python3 -c "import urllib.request, ssl, socket, requests, httpx"
DOCKERFILE
step "docker build $TOOLS_IMAGE_TAG (${#debs[@]} packages)" \
  docker build --force-rm --network none --build-arg "BASE_IMAGE=$BASE_IMAGE_TAG" -t "$TOOLS_IMAGE_TAG" "$stage"
log "built $TOOLS_IMAGE_TAG ($(docker image inspect -f '{{.Size}}' "$TOOLS_IMAGE_TAG" | awk '{printf "%.0f MB", $1/1000000}'))"
echo "$TOOLS_IMAGE_TAG"
