# Two commands on a fresh machine: `make demo` and `make test`. Each creates .venv if missing
# and installs the pinned dependencies (requirements.lock) first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml requirements.lock | cksum | cut -d' ' -f1)

.PHONY: setup demo test faults bench lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml requirements.lock
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c requirements.lock -e '.[dev]'
	@rm -f $(VENV)/.installed-* && touch $@

demo: setup
	$(BIN)/python -m workers.demo

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy interlock_temporal workflows workers benchmarks

test: lint
	$(BIN)/python -m pytest -q

faults: setup
	$(BIN)/python -m workers.faults

bench: setup
	$(BIN)/python -m benchmarks

clean:
	rm -rf .demo .bench .pytest_cache .mypy_cache .ruff_cache
