#!/usr/bin/env bash
# Builds the local base image ($BASE_IMAGE_TAG): a minimal Debian made with debootstrap and
# imported into the project's dockerd. There is no registry to pull from. Reused when present.
source "$(dirname "$0")/lib.sh"
export DOCKER_HOST="unix://$DEV_DIR/docker.sock"

if docker image inspect "$BASE_IMAGE_TAG" >/dev/null 2>&1; then exit 0; fi
command -v debootstrap >/dev/null || {
  log "installing debootstrap"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
}
mirror=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n1)
[[ -n $mirror ]] || mirror=$(awk '$1=="deb"{print $2; exit}' /etc/apt/sources.list 2>/dev/null)
[[ -n $mirror ]] || die "no Debian mirror found in the apt sources"
rootfs=$(mktemp -d "$CACHE_DIR/rootfs.XXXXXX")
trap 'rm -rf "$rootfs"' EXIT
log "debootstrap --variant=minbase $BASE_IMAGE_SUITE from $mirror"
debootstrap --variant=minbase "$BASE_IMAGE_SUITE" "$rootfs" "$mirror" >"$CACHE_DIR/debootstrap.log" 2>&1 ||
  die "debootstrap failed; see $CACHE_DIR/debootstrap.log"
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
log "importing $BASE_IMAGE_TAG"
tar -C "$rootfs" -c . | docker import \
  --change 'CMD ["/bin/sh"]' \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  - "$BASE_IMAGE_TAG" >/dev/null
log "built $BASE_IMAGE_TAG ($(docker image inspect "$BASE_IMAGE_TAG" --format '{{.Size}}') bytes)"
