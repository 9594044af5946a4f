#!/usr/bin/env bash
# The virtualenv of the API fuzz test: Schemathesis at the pin in hack/versions.env, from PyPI.
# Made once per pin under the cache and reused; a virtualenv for another pin is another folder.
# Prints the path of the virtualenv's `st` (the Schemathesis command) on stdout.
source "$(dirname "$0")/lib.sh"
: "${SCHEMATHESIS_VERSION:?hack/versions.env must pin SCHEMATHESIS_VERSION}"
VENV="$CACHE_DIR/schemathesis/venv-$SCHEMATHESIS_VERSION"
python_venv "$VENV" "API fuzz test: virtualenv with schemathesis $SCHEMATHESIS_VERSION" \
  "schemathesis==$SCHEMATHESIS_VERSION"
echo "$VENV/bin/st"
