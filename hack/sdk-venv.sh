#!/usr/bin/env bash
# The virtualenv of the Python SDK (sdk/python): its dependencies, Pydantic AI and the test tools
# (pytest, ruff, mypy) at the pins in hack/versions.env, from PyPI. Made once per set of pins
# under the cache and reused; another set of pins is another folder. Prints its python on stdout.
source "$(dirname "$0")/lib.sh"
PINS=(
  "httpx==${SDK_HTTPX_VERSION:?}"
  "anyio==${SDK_ANYIO_VERSION:?}"
  "kubernetes-asyncio==${SDK_KUBERNETES_ASYNCIO_VERSION:?}"
  "aiohttp==${SDK_AIOHTTP_VERSION:?}"
  "requests==${TEST_REQUESTS_VERSION:?}"
  "mcp==${TEST_MCP_VERSION:?}"
  "pydantic-ai-slim==${SDK_PYDANTIC_AI_SLIM_VERSION:?}"
  "pytest==${SDK_PYTEST_VERSION:?}"
  "ruff==${SDK_RUFF_VERSION:?}"
  "mypy==${SDK_MYPY_VERSION:?}"
)
KEY="$(printf '%s\n' "${PINS[@]}" | sha256sum | cut -c1-12)"
VENV="$CACHE_DIR/sdk/venv-$KEY"
python_venv "$VENV" "Python SDK: virtualenv with ${PINS[*]}" "${PINS[@]}"
echo "$VENV/bin/python"
