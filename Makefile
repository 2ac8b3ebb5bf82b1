# `make run` runs the whole pipeline locally; `make test` runs the test suite. Both create the
# virtual environment (.venv, Python 3.10, from requirements.lock) on first use, with bytecode
# compiled at install: where PYTHONDONTWRITEBYTECODE is set (as in the images) Python would
# otherwise compile TensorFlow's and TFX's sources at every start (~35 s instead of ~12 s).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
UV_VERSION := 0.13.8
ARGS ?=

.PHONY: ci venv run test lint format add-span store bench lock clean compile specs submit schedule \
	images base-image

venv: $(VENV)/.installed

$(VENV)/.installed: requirements.lock pyproject.toml
	@set -euo pipefail; \
	if [ -n "$${PYTHON310:-}" ]; then candidates="$$PYTHON310"; else \
	  candidates="python3.10 /usr/bin/python3.10 /usr/local/bin/python3.10 $$(pyenv versions --bare 2>/dev/null \
	    | grep -E '^3\.10(\.|$$)' | sed "s|^|$$(pyenv root 2>/dev/null)/versions/|; s|$$|/bin/python3.10|" || true)"; \
	fi; \
	py=""; \
	for candidate in $$candidates; do \
	  if "$$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 10)' >/dev/null 2>&1; then \
	    py="$$(command -v "$$candidate")"; break; fi; \
	done; \
	if [ -z "$$py" ]; then \
	  echo "error: no working Python 3.10 found (tried: $$candidates); TFX 1.16 needs Python 3.10." >&2; \
	  echo "Install it (e.g. 'pyenv install 3.10.13') or set PYTHON310=/path/to/python3.10." >&2; \
	  exit 1; \
	fi; \
	uv="$$(command -v uv || true)"; \
	if [ -z "$$uv" ]; then \
	  echo "Installing uv $(UV_VERSION) into .work/uv ..."; \
	  python3 -m venv .work/uv && .work/uv/bin/pip install --quiet uv==$(UV_VERSION); \
	  uv=.work/uv/bin/uv; \
	fi; \
	echo "Creating $(VENV) with $$py from requirements.lock ..."; \
	"$$uv" venv --quiet --allow-existing --python "$$py" $(VENV); \
	"$$uv" pip sync --compile-bytecode --python $(PY) requirements.lock; \
	"$$uv" pip install --quiet --python $(PY) --no-deps -e .; \
	touch $@

run: venv
	@$(PY) -m pipelines.cli run $(ARGS)

add-span: venv
	@$(PY) -m pipelines.cli add-span $(ARGS)

store: venv
	@$(PY) -m pipelines.cli store $(ARGS)

# Benchmark (about 15 min on 2 CPUs); writes bench/results.{json,md} and the chart.
bench: venv
	@$(PY) -m pipelines.cli bench $(ARGS)

# The CI recipe is linted too: actionlint, with shellcheck on its run: scripts. lint-imports
# checks the layering written down in pyproject.toml ([tool.importlinter]).
lint: venv
	$(VENV)/bin/ruff check pipelines components tests
	$(VENV)/bin/ruff format --check pipelines components tests
	$(VENV)/bin/lint-imports --no-cache
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/actionlint .github/workflows/*.yml

format: venv
	$(VENV)/bin/ruff check --fix pipelines components tests
	$(VENV)/bin/ruff format pipelines components tests

# --durations: the slowest tests' times in every log, so CI's budget can be watched.
# TEST_WORKERS processes share the tests a file at a time (pytest-xdist --dist loadgroup, groups
# by file: tests/conftest.py; a module fixture is built once); one test process
# keeps a 2-core machine about half idle (it waits on the processes it starts).
TEST_WORKERS ?= 2
test: lint
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=30 $(ARGS)

# What CI runs on a clean machine (.ci/run: the container tests' Debian packages, then make test).
ci:
	bash .ci/run

# Re-resolve the lock after changing pyproject.toml (needs uv on PATH).
lock:
	uv pip compile pyproject.toml --extra dev --python-version 3.10 \
	  --python-platform x86_64-manylinux_2_28 -o requirements.lock

clean:
	rm -rf .work

# Kubeflow: compile the configured use case (use_case, PIPELINE_USE_CASE) with your settings
# (ARGS="--set cpu_image=... --set gpu_image=...", PIPELINE_* variables) into
# .work/kubeflow/pipeline-<use case>.yaml, or SPEC: what submit, schedule and watch send.
# `make specs` rewrites the committed kubeflow/pipeline-<name>.yaml of every shipped use case from
# the defaults alone (commit them; a test fails when one is stale); compile never writes them.
SPEC ?=
compile: venv
	@$(PY) -m pipelines.cli compile $(if $(SPEC),--output "$(SPEC)") $(ARGS)

specs: venv
	@$(PY) -m pipelines.cli compile --committed $(ARGS)

# Kubeflow: one run of SPEC (default: what `make compile` wrote), and the recurring run (CRON,
# 5 fields; REPLACE=1 moves an existing one of the same name to SPEC, as CI does after a merge). The endpoint is KFP_ENDPOINT, a
# bearer token (if the API wants one) KFP_TOKEN.
CRON ?=
REPLACE ?=
submit: venv
	@$(PY) -m pipelines.cli submit $(if $(SPEC),--package "$(SPEC)") $(ARGS)

schedule: venv
	$(if $(CRON),,$(error CRON is required, e.g. make schedule CRON="0 2 * * *"))
	@$(PY) -m pipelines.cli schedule $(if $(SPEC),--package "$(SPEC)") --cron "$(CRON)" \
	  $(if $(REPLACE),--replace) $(ARGS)

# Kubeflow: build the step images with podman or docker (pipelines/kubeflow/images.py). BASE=local builds
# on a Debian minbase + this machine's Python 3.10 (for machines that reach no image registry);
# GPU=1 adds the CUDA image; PUSH=1 then pushes them. The tags are the config's cpu_image /
# gpu_image (PIPELINE_CPU_IMAGE, PIPELINE_GPU_IMAGE).
BASE ?=
GPU ?=
PUSH ?=
images: venv
	@$(PY) -m pipelines.cli images $(if $(BASE),--base $(BASE)) $(if $(GPU),--gpu) \
	  $(if $(PUSH),--push) $(ARGS)

base-image: venv
	@$(PY) -m pipelines.cli images --base-only $(ARGS)
