# The developer's toolbox. `make demo` runs the project on the local default; `make test` runs
# every test. See README.md.
SHELL := /bin/bash
CARGO ?= cargo
ENV = eval "$$(hack/env.sh)"

.PHONY: up down env demo images generate lint test unit e2e wire-venv schemathesis-venv sdk-venv sdk-test faults bench

up: ## build (once) and start the control plane, dockerd and the base image
	hack/up.sh

down: ## stop what `make up` started
	hack/down.sh

env: ## print the export lines for KUBECONFIG, DOCKER_HOST, SANDBOXD_BASE_IMAGE
	@hack/env.sh

demo: ## the main job: build, up, CRDs, a sandboxd and the operator, a session opened with kubectl sandbox
	hack/demo.sh

bench: up ## the benchmarks, release builds, each against its own baseline (docs/benchmarks.md); BENCH=sandboxd|open|operator|egress|isolation|wire|interactive|snapshot runs one
	hack/bench.sh $(BENCH)

images: ## the sandboxd and sandbox-operator images, tagged with the workspace version (PROFILE=release|debug)
	hack/images.sh

generate: ## regenerate every generated file (CRD YAML, Runtime manifests, docs/openapi.json, docs/openapi-wire.json)
	$(CARGO) run -q -p sandboxd-crds --bin crdgen -- .
	$(CARGO) run -q -p sandboxd-crds --bin runtimegen -- .
	$(CARGO) run -q -p sandboxd --bin sandboxd -- openapi > docs/openapi.json.tmp
	mv docs/openapi.json.tmp docs/openapi.json
	$(CARGO) run -q -p sandboxd --bin sandboxd -- openapi --wire > docs/openapi-wire.json.tmp
	mv docs/openapi-wire.json.tmp docs/openapi-wire.json

lint: ## formatting and clippy, warnings are errors
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

wire-venv: ## the wire tests' virtualenv: pydantic-ai-backend at its pin, from PyPI (once per pin)
	@hack/wire-venv.sh >/dev/null

schemathesis-venv: ## the API fuzz test's virtualenv: Schemathesis at its pin, from PyPI (once per pin)
	@hack/schemathesis-venv.sh >/dev/null

sdk-venv: ## the Python SDK's virtualenv: its dependencies and test tools at their pins, from PyPI (once per pins)
	@hack/sdk-venv.sh >/dev/null

# The Python SDK (sdk/python): ruff, mypy, and pytest against the real stack (its fixture starts
# the workspace's sandboxd and operator, so they are built first).
sdk-test: sdk-venv ## the Python SDK's lint, types and tests (pytest, on the stack `make up` started)
	$(CARGO) build -p sandboxd -p sandboxd-operator --bins
	PY="$$(hack/sdk-venv.sh)" && cd sdk/python && "$$PY" -m ruff check . && "$$PY" -m ruff format --check . \
	  && "$$PY" -m mypy
	$(ENV) && PY="$$(hack/sdk-venv.sh)" && cd sdk/python && timeout --kill-after=30 1500 "$$PY" -m pytest

# Everything: lint, the unit tests, the end-to-end tests, the SDK's, then the fault harness.
test: up lint ## everything: up, lint, unit and end-to-end tests (the wire and SDK tests run pytest), then the fault harness
	$(MAKE) unit
	$(MAKE) e2e
	$(MAKE) sdk-test
	$(MAKE) faults

# No stack: every crate's unit tests (library and binaries), the dependency rules of the client
# crates (`cargo tree`, offline) and the trash's descriptor bound (a child under `ulimit -n 16`).
# The audit store's PostgreSQL cases (POSTGRES_UNIT) need the stack's PostgreSQL: `make e2e`.
POSTGRES_UNIT = storage::audit::tests::postgres_
unit: ## the unit tests: no stack needed (no API server, dockerd or PostgreSQL), a minute once built
	$(CARGO) test --workspace --no-fail-fast --lib --bins --test dependencies --test trash_descriptors -- --skip $(POSTGRES_UNIT)

# The end-to-end tests start the workspace's binaries (sandboxd, sandbox-operator), so they are
# built first. A hung test must not hold CI to its own limit: the run is bounded. Then the
# hostile-sandbox suite, Pydantic AI's client suite and the terminals, ports and watch tests
# again with every sandbox on gVisor
# (SANDBOXD_TEST_OCI_RUNTIME=runsc: the harness starts each sandboxd with that OCI runtime).
e2e: up wire-venv schemathesis-venv ## the end-to-end tests (every crate's tests/): on the stack `make up` starts; the hostile and Pydantic AI suites on runc and on gVisor
	$(CARGO) build --workspace --bins
	$(ENV) && status=0 \
	  && { timeout --kill-after=30 2700 $(CARGO) test --workspace --no-fail-fast --test '*' || status=$$?; } \
	  && { SANDBOXD_TEST_OCI_RUNTIME=runsc timeout --kill-after=30 1500 $(CARGO) test -p sandboxd --no-fail-fast \
	         --test 'hostile*' --test wire --test terminals --test ports --test watch \
	         -- --skip seed_and_ours_side_by_side || status=$$?; } \
	  && $(CARGO) test -p sandboxd --lib -- $(POSTGRES_UNIT) && exit $$status

# kill -9 of the operator, a sandboxd, the API server, etcd and dockerd during a random workload
# (tests/src/bin/faults.rs, docs/reliability.md). Not a cargo test: it kills what the tests
# share, so it runs alone, after them. SEED=… TRIALS=… replay a run; TARGETS=operator,sandboxd
# limits what is killed.
faults: ## the fault harness: TRIALS trials (10) from SEED (1); exits non-zero on a broken invariant
	$(CARGO) build --workspace --bins
	$(ENV) && timeout --kill-after=30 1800 $(CARGO) run -q -p sandboxd-tests --bin faults -- --trials $(or $(TRIALS),10) --seed $(or $(SEED),1) $(if $(TARGETS),--targets $(TARGETS))
