# The developer's toolbox. `make demo` runs the project on the local default; `make test` runs
# every test. See README.md.
SHELL := /bin/bash
CARGO ?= cargo
ENV = eval "$$(hack/env.sh)"

.PHONY: up down env demo generate lint test unit e2e

up: ## build (once) and start the control plane, dockerd and the base image
	hack/up.sh

down: ## stop what `make up` started
	hack/down.sh

env: ## print the export lines for KUBECONFIG, DOCKER_HOST, SANDBOXD_BASE_IMAGE
	@hack/env.sh

demo: ## the main job: up, CRDs and Runtimes installed, shown
	hack/demo.sh

generate: ## regenerate every generated file (CRD YAML, Runtime manifests)
	$(CARGO) run -q -p sandboxd-crds --bin crdgen -- .
	$(CARGO) run -q -p sandboxd-crds --bin runtimegen -- .

lint: ## formatting and clippy, warnings are errors
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

test: up lint ## everything: up, lint, unit and end-to-end tests
	$(ENV) && $(CARGO) test --workspace --no-fail-fast
