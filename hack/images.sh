#!/usr/bin/env bash
# `make images`: the operator and sandboxd images, built with the project's dockerd from the
# local base image ($BASE_IMAGE_TAG) and the binaries cargo builds on this machine (no compiler
# and nothing pulled in the image build), tagged with the workspace version:
#   sandbox-operator:<version>, sandboxd:<version>
# and loaded into the local node's containerd when it runs (hack/node.sh; no registry).
# PROFILE=release (default) or debug picks the cargo profile; SANDBOXD_BIN_DIR names a folder
# of binaries already built (then cargo is not run). Binaries are stripped into the image.
source "$(dirname "$0")/lib.sh"
eval "$("$HACK_DIR/env.sh")"
export DOCKER_BUILDKIT=0 # the classic builder: no buildx here, and nothing to pull
PROFILE="${PROFILE:-release}"
VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT_DIR/Cargo.toml" | head -1)"
[[ -n $VERSION ]] || die "no version in Cargo.toml [workspace.package]"
docker image inspect "$BASE_IMAGE_TAG" >/dev/null 2>&1 || die "base image $BASE_IMAGE_TAG is missing: run \`make up\`"
if [[ -n ${SANDBOXD_BIN_DIR:-} ]]; then
  BIN_DIR="$SANDBOXD_BIN_DIR"
else
  log "images: cargo build --profile $PROFILE (sandboxd, sandbox-operator)"
  (cd "$ROOT_DIR" && cargo build --profile "$([[ $PROFILE == debug ]] && echo dev || echo "$PROFILE")" \
    -p sandboxd -p sandboxd-operator --bin sandboxd --bin sandbox-operator)
  BIN_DIR="${CARGO_TARGET_DIR:-$ROOT_DIR/target}/$PROFILE"
fi
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT

# sandboxd fences in the network of sandboxes with iptables, and its egress proxy verifies the
# servers it reaches for a credential against the system roots (which sandboxes of allowlist
# runtimes are given with the node's egress CA): Debian's iptables and ca-certificates and the
# libraries the base image lacks, fetched with this machine's apt (same suite as the base image) and
# installed with dpkg in the build, so nothing is pulled there.
debs="$stage/sandboxd/debs"
mkdir -p "$debs"
present="$(docker run --rm --network none "$BASE_IMAGE_TAG" dpkg-query -W -f '${Package}\n')"
wanted="$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
  --no-replaces --no-enhances --no-pre-depends iptables ca-certificates | grep -v '^[ <]' | sort -u)"
missing=()
for pkg in $wanted; do grep -qx "$pkg" <<<"$present" || missing+=("$pkg"); done
(cd "$debs" && apt-get download "${missing[@]}" >/dev/null 2>&1) || {
  log "images: apt-get download ${missing[*]} failed; updating the package lists"
  apt-get update -qq >/dev/null
  (cd "$debs" && apt-get download "${missing[@]}" >/dev/null) || die "cannot download ${missing[*]} (Debian's mirror)"
}
for pair in "sandboxd:sandboxd" "operator:sandbox-operator"; do
  file="${pair%%:*}" bin="${pair#*:}"
  [[ -x $BIN_DIR/$bin ]] || die "$BIN_DIR/$bin is missing: build it with cargo build --bins"
  mkdir -p "$stage/$file"
  strip -o "$stage/$file/$bin" "$BIN_DIR/$bin"
  docker build -q -f "$ROOT_DIR/images/$file.Dockerfile" \
    --build-arg "BASE_IMAGE=$BASE_IMAGE_TAG" --build-arg "VERSION=$VERSION" \
    -t "$bin:$VERSION" "$stage/$file" >/dev/null
  log "images: built $bin:$VERSION ($(docker image inspect -f '{{.Size}}' "$bin:$VERSION" | awk '{printf "%.0f MB", $1/1000000}'))"
done
if "$HACK_DIR/node.sh" running; then
  "$HACK_DIR/node.sh" load "sandboxd:$VERSION" "sandbox-operator:$VERSION"
else
  log "images: the local node does not run (make up starts it): nothing loaded into it"
fi
