# Two commands a new user needs: `make run` and `make test`. Everything else is a helper.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: run test bot migrate lint demo-model int4-kernel clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# Serving needs no torch; the marker files make re-runs instant.
$(VENV)/.run-installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

# torch is pinned and installed first, alone, so nothing pulls another build.
$(VENV)/.dev-installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,export]'
	touch $@ $(VENV)/.run-installed

# Our int4 kernel (api/engine/int4_build.py): built when a C compiler and ONNX Runtime's C
# header can be had, else serving keeps ONNX Runtime's kernel. INT4_BUILD_FLAGS=--require fails
# instead (CI).
INT4_LIBRARY := $(VENV)/lib/tokenshop/libtokenshop_int4.so
$(INT4_LIBRARY): $(wildcard api/engine/csrc/*.c api/engine/csrc/*.h) | $(VENV)/.run-installed
	$(BIN)/python -m api.engine.int4_build $(INT4_BUILD_FLAGS)

int4-kernel: $(INT4_LIBRARY)

migrate: $(VENV)/.run-installed $(INT4_LIBRARY)
	$(BIN)/alembic upgrade head

run: migrate
	$(BIN)/tokenshop serve --host $(HOST) --port $(PORT)

bot: migrate
	$(BIN)/tokenshop bot

test: $(VENV)/.dev-installed $(INT4_LIBRARY)
	$(BIN)/pytest $(PYTEST_ARGS)

lint: $(VENV)/.dev-installed
	$(BIN)/ruff check api bot billing tests bench
	$(BIN)/ruff format --check api bot billing tests bench
	$(BIN)/mypy api billing bot

demo-model: $(VENV)/.dev-installed
	$(BIN)/python models/make_demo.py models/demo

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
