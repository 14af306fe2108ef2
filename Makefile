# Two commands a new user needs: `make run` and `make test`. Everything else is a helper.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: run test test-fast bot migrate lint demo-model ops clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# Serving needs no torch; the marker files make re-runs instant.
$(VENV)/.run-installed: pyproject.toml setup.py | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

# torch is pinned and installed first, alone, so nothing pulls another build.
$(VENV)/.dev-installed: pyproject.toml setup.py | $(BIN)/python
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,export]'
	touch $@ $(VENV)/.run-installed

# Our ops library (api/engine/ops/build.py): installing the package compiles it; this rebuilds
# it after a change to its sources. Without a C compiler serving keeps ONNX Runtime's kernels;
# TOKENSHOP_REQUIRE_OPS=1 fails instead (CI).
OPS_LIBRARY := api/engine/ops/libtokenshop_ops.so
$(OPS_LIBRARY): $(wildcard api/engine/ops/csrc/*.c api/engine/ops/csrc/*.h) | $(VENV)/.run-installed
	$(BIN)/python -m api.engine.ops.build

ops: $(OPS_LIBRARY)

migrate: $(VENV)/.run-installed $(OPS_LIBRARY)
	$(BIN)/alembic upgrade head

run: migrate
	$(BIN)/tokenshop serve --host $(HOST) --port $(PORT)

bot: migrate
	$(BIN)/tokenshop bot

test: $(VENV)/.dev-installed $(OPS_LIBRARY)
	$(BIN)/pytest $(PYTEST_ARGS)

# Everything but the tests marked slow (real model exports, the ledger model, long load runs,
# builds); CI runs `make test`, all of them. On SQLite (each test its own file) one pytest-xdist
# worker per core; on PostgreSQL one process, as its advisory locks span every test's schema.
FAST_WORKERS := $(if $(TEST_DATABASE_URL),0,auto)
test-fast: $(VENV)/.dev-installed $(OPS_LIBRARY)
	$(BIN)/pytest -m "not slow" -n $(FAST_WORKERS) $(PYTEST_ARGS)

# lint-imports checks who may import whom: the contracts under [tool.importlinter] in pyproject.
lint: $(VENV)/.dev-installed
	$(BIN)/ruff check api bot billing tokenshop tests bench
	$(BIN)/ruff format --check api bot billing tokenshop tests bench
	$(BIN)/mypy api billing bot tokenshop
	$(BIN)/lint-imports

demo-model: $(VENV)/.dev-installed
	$(BIN)/python models/make_demo.py models/demo
	$(BIN)/python models/make_demo_embed.py models/demo-embed

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
