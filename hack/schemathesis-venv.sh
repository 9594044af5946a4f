#!/usr/bin/env bash
# The virtualenv of the API fuzz test: Schemathesis at the pin in hack/versions.env, from PyPI.
# Made once per pin under the cache and reused; a virtualenv for another pin is another folder.
# Prints the path of the virtualenv's `st` (the Schemathesis command) on stdout.
source "$(dirname "$0")/lib.sh"
: "${SCHEMATHESIS_VERSION:?hack/versions.env must pin SCHEMATHESIS_VERSION}"
VENV="$CACHE_DIR/schemathesis/venv-$SCHEMATHESIS_VERSION"
if [[ ! -f $VENV/.complete ]]; then
  command -v python3 >/dev/null || die "python3 is missing (Debian: apt-get install python3 python3-venv)"
  if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
    log "installing python3-venv"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >&2 \
      || die "python3 has no venv module and python3-venv could not be installed"
  fi
  rm -rf "$VENV"
  mkdir -p "$(dirname "$VENV")"
  log "API fuzz test: virtualenv with schemathesis $SCHEMATHESIS_VERSION in $VENV"
  python3 -m venv "$VENV" >&2
  # Where TLS is intercepted by a proxy (the CI machines do that), pip trusts the host's CAs.
  if [[ -f /etc/ssl/certs/ca-certificates.crt ]]; then export PIP_CERT=/etc/ssl/certs/ca-certificates.crt; fi
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check \
    "schemathesis==$SCHEMATHESIS_VERSION" >&2 \
    || die "pip could not install schemathesis==$SCHEMATHESIS_VERSION from PyPI"
  touch "$VENV/.complete"
fi
echo "$VENV/bin/st"
