#!/usr/bin/env bash
# The virtualenv of the wire tests: pydantic-ai-backend at the pin in hack/versions.env, from
# PyPI, with its client (`remote`), its pydantic-ai workspace (`console`) and its own service
# (`server`, for the benchmark), and pytest. Made once per pin under the cache and reused; a
# virtualenv for another pin is another folder. Prints the virtualenv's python on stdout.
source "$(dirname "$0")/lib.sh"
: "${PYDANTIC_AI_BACKEND_VERSION:?hack/versions.env must pin PYDANTIC_AI_BACKEND_VERSION}"
VENV="$CACHE_DIR/wire/venv-$PYDANTIC_AI_BACKEND_VERSION"
PY="$VENV/bin/python"
if [[ ! -f $VENV/.complete ]]; then
  command -v python3 >/dev/null || die "python3 is missing (Debian: apt-get install python3 python3-venv)"
  if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
    log "installing python3-venv"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >&2 \
      || die "python3 has no venv module and python3-venv could not be installed"
  fi
  rm -rf "$VENV"
  mkdir -p "$(dirname "$VENV")"
  log "wire tests: virtualenv with pydantic-ai-backend $PYDANTIC_AI_BACKEND_VERSION in $VENV"
  python3 -m venv "$VENV" >&2
  # Where TLS is intercepted by a proxy (the CI machines do that), pip trusts the host's CAs.
  if [[ -f /etc/ssl/certs/ca-certificates.crt ]]; then export PIP_CERT=/etc/ssl/certs/ca-certificates.crt; fi
  "$PY" -m pip install -q --disable-pip-version-check \
    "pydantic-ai-backend[remote,console,server]==$PYDANTIC_AI_BACKEND_VERSION" "pytest>=8,<10" >&2 \
    || die "pip could not install pydantic-ai-backend==$PYDANTIC_AI_BACKEND_VERSION from PyPI"
  touch "$VENV/.complete"
fi
echo "$PY"
