#!/usr/bin/env bash
# The virtualenv of the wire tests: pydantic-ai-backend at the pin in hack/versions.env, from
# PyPI, with its client (`remote`), its pydantic-ai workspace (`console`) and its own service
# (`server`, for the benchmark), and pytest. Made once per pin under the cache and reused; a
# virtualenv for another pin is another folder. Prints the virtualenv's python on stdout.
source "$(dirname "$0")/lib.sh"
: "${PYDANTIC_AI_BACKEND_VERSION:?hack/versions.env must pin PYDANTIC_AI_BACKEND_VERSION}"
VENV="$CACHE_DIR/wire/venv-$PYDANTIC_AI_BACKEND_VERSION"
python_venv "$VENV" "wire tests: virtualenv with pydantic-ai-backend $PYDANTIC_AI_BACKEND_VERSION" \
  "pydantic-ai-backend[remote,console,server]==$PYDANTIC_AI_BACKEND_VERSION" "pytest>=8,<10"
echo "$VENV/bin/python"
