#!/usr/bin/env bash
# Builds the busybox-only test image: nothing but Debian's static busybox (package
# busybox-static) and its applet links, imported into the project's dockerd with no libc, no
# /etc/passwd and no shell but busybox's. It proves that a sandbox works in any image: the
# sandbox agent is static and brings everything it needs. Reused when present; prints the tag.
source "$(dirname "$0")/lib.sh"
export DOCKER_HOST="${DOCKER_HOST:-unix://$DEV_DIR/docker.sock}"
tag=sandboxd-busybox:1

if docker image inspect "$tag" >/dev/null 2>&1; then echo "$tag"; exit 0; fi
work=$(mktemp -d "${TMPDIR:-/tmp}/busybox-image.XXXXXX")
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download busybox-static >/dev/null 2>&1) || {
  log "apt-get download busybox-static failed; updating the package lists"
  apt-get update -qq >/dev/null
  (cd "$work" && apt-get download busybox-static >/dev/null)
}
dpkg-deb -x "$work"/busybox-static_*.deb "$work/pkg"
rootfs="$work/rootfs"
mkdir -p "$rootfs/bin" "$rootfs/tmp"
cp "$work/pkg/bin/busybox" "$rootfs/bin/busybox"
for applet in $("$rootfs/bin/busybox" --list-full); do
  [[ $applet == bin/busybox ]] && continue
  mkdir -p "$rootfs/$(dirname "$applet")"
  ln -sf /bin/busybox "$rootfs/$applet"
done
tar -C "$rootfs" -c . | docker import \
  --change 'CMD ["/bin/sh"]' \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  - "$tag" >/dev/null
log "built $tag ($(docker image inspect "$tag" --format '{{.Size}}') bytes)"
echo "$tag"
