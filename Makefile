# Two commands on a fresh machine: `make demo` and `make test`. Each creates .venv if missing
# and installs the pinned dependencies (requirements.lock) first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml requirements.lock | cksum | cut -d' ' -f1)

.PHONY: setup browser pgbouncer stripe-mock demo test faults bench mutants lint docs clean

setup: $(STAMP)

$(STAMP): pyproject.toml requirements.lock
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c requirements.lock -e '.[dev]'
	@rm -f $(VENV)/.installed-* && touch $@

# make demo DEMO_ARGS=--stripe runs the story against the Stripe fake
DEMO_ARGS ?=

demo: setup stripe-mock
	$(BIN)/python -m workers.demo $(DEMO_ARGS)

MYPY := $(BIN)/mypy interlock_temporal workflows workers benchmarks

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(MYPY)

# The Web UI test drives Debian's chromium with Playwright (pinned in pyproject's dev extra and
# requirements.lock; its wheel bundles the driver; `playwright install` is never run: browsers
# cannot be downloaded here). Quick when both are present.
CHROMIUM := /usr/bin/chromium
APT_GET  := $(if $(filter 0,$(shell id -u)),,sudo )env DEBIAN_FRONTEND=noninteractive apt-get

browser: setup
	@test -x $(CHROMIUM) || $(APT_GET) install -y chromium \
		|| { $(APT_GET) update && $(APT_GET) install -y chromium; }
	@test -x $(CHROMIUM) || { echo "$(CHROMIUM) is still missing after apt-get" >&2; exit 1; }
	@$(BIN)/python -c "import playwright.async_api"

# The PostgreSQL journal refuses a pooling proxy in transaction mode: its test puts Debian's
# pgbouncer (started by the test, on loopback, never as a service) in front of a throwaway cluster.
PGBOUNCER := /usr/sbin/pgbouncer

pgbouncer:
	@test -x $(PGBOUNCER) || $(APT_GET) install -y pgbouncer \
		|| { $(APT_GET) update && $(APT_GET) install -y pgbouncer; }
	@test -x $(PGBOUNCER) || { echo "$(PGBOUNCER) is still missing after apt-get" >&2; exit 1; }

# The Stripe fake (stripe-stateful-mock, pinned in tools/stripe-mock/package-lock.json),
# installed with the machine's npm; it runs on loopback only.
STRIPE_MOCK := tools/stripe-mock/node_modules/stripe-stateful-mock

stripe-mock: $(STRIPE_MOCK)

$(STRIPE_MOCK): tools/stripe-mock/package.json tools/stripe-mock/package-lock.json
	cd tools/stripe-mock && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

# The tests in $(TEST_PROCESSES) pytest processes (pytest-xdist): the real-server tests spend
# most of their time waiting on servers, so three share CI's two cores well; each process starts
# its own dev server and PostgreSQL cluster. mypy (a minute of CPU on a fresh checkout) runs
# beside them, and its report follows theirs; ruff first (it takes a second).
TEST_PROCESSES ?= 3

test: browser pgbouncer stripe-mock
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(MKDOCS) build --strict --quiet --site-dir $(VENV)/site
	@$(MYPY) > $(VENV)/mypy-report.txt 2>&1 & types=$$!; \
	$(BIN)/python -m pytest -q -n $(TEST_PROCESSES); tests=$$?; \
	wait $$types; typed=$$?; echo "$(MYPY)"; cat $(VENV)/mypy-report.txt; rm -f $(VENV)/mypy-report.txt; \
	test $$tests -eq 0 -a $$typed -eq 0

# The full fault matrix, then the tests too slow for make test (marked faults: the real code's
# exhaustive checks, a real outage), and the property tests again at their full counts (make
# test draws a fifth of each: tests/properties.py), in two processes (CI's two cores; most of
# these wait on a real server).
faults: setup stripe-mock
	$(BIN)/python -m workers.faults
	INTERLOCK_FULL_PROPERTIES=1 $(BIN)/python -m pytest -q -n 2 -m "faults or properties"

bench: setup
	$(BIN)/python -m benchmarks

# The documentation site (mkdocs.yml, docs/): `make docs` serves it on localhost:8000 and rebuilds
# a page as it is edited; make test builds it with --strict (a broken link or anchor, a missing
# page or an API reference that does not resolve fails). Built into .venv/site, never the tree.
MKDOCS := NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs

docs: setup
	$(MKDOCS) serve

# Mutation testing of the core (docs/evidence.md): mutmut over the modules pyproject's
# [tool.mutmut] names, against the fast in-process suite it lists; mypy (on PATH from the venv)
# rejects the mutants that could never be merged. A fresh run each time: mutmut keeps an old
# verdict when only the tests changed. Niced, for a machine shared with other runs; not part of
# `make test`. MUTANTS="interlock_temporal.core.leases*" runs the mutants of one module only.
MUTANTS ?=

mutants: setup
	rm -rf mutants
	PATH="$(CURDIR)/$(BIN):$$PATH" nice -n 19 $(BIN)/mutmut run $(MUTANTS)
	$(BIN)/mutmut results --all true | $(BIN)/python tools/mutation_score.py

clean:
	rm -rf .demo .bench site mutants .pytest_cache .mypy_cache .ruff_cache tools/stripe-mock/node_modules
