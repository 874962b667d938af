# The README's two commands: `make demo` (set up, run the main job on the local sandbox)
# and `make test` (the whole suite, as CI runs it). Nothing but Python 3.11+ is needed.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
MESSAGES ?= 40
# The demo's tasks: the same every run (which are expired, which route where), so what it
# shows, and tests/test_docs.py's check of it, never depend on a draw. SEED=N for others.
SEED   ?= 7
PORT   ?= $(shell $(PYTHON) -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

.PHONY: install localstack demo test test-clock-ahead test-minimums minimums-if-changed lint typecheck docs unit suite browser rabbitmq rabbitmq4 postgres bench profile clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test,docs]"
	touch $@

install: $(VENV)/.installed

# LocalStack's SQS for the tests that run against it (tests/localstack_server.py): on the
# host, no Docker, in a venv of its own (its pins clash with moto's and boto3's), from the
# exact pins of requirements/localstack.txt. The tests find its python at
# $(LOCALSTACK_VENV)/bin/python, or at REDRIVE_LOCALSTACK_PYTHON.
LOCALSTACK_VENV ?= .venv-localstack
$(LOCALSTACK_VENV)/.installed: requirements/localstack.txt
	$(PYTHON) -m venv $(LOCALSTACK_VENV)
	$(LOCALSTACK_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(LOCALSTACK_VENV)/bin/python -m pip install --quiet -r requirements/localstack.txt
	touch $@

localstack: $(LOCALSTACK_VENV)/.installed

# Start the sandbox (a local SQS on 127.0.0.1 with the built-in families and seeded DLQs),
# look at it the way an on-call engineer would, then stop it.
demo: install
	@set -e; \
	$(BIN)/redrive sandbox --port $(PORT) --messages $(MESSAGES) --seed $(SEED) > .sandbox.env 2> .sandbox.log & pid=$$!; \
	trap 'kill $$pid 2>/dev/null; wait $$pid 2>/dev/null; rm -f .sandbox.env .sandbox.log' EXIT; \
	for i in $$(seq 1 300); do grep -q 'sandbox ready' .sandbox.log 2>/dev/null && break; \
	  kill -0 $$pid 2>/dev/null || { cat .sandbox.log; exit 1; }; sleep 0.2; done; \
	. ./.sandbox.env; \
	echo '$$ redrive status'; $(BIN)/redrive status; echo; \
	echo '$$ redrive report'; $(BIN)/redrive report; echo; \
	echo '$$ redrive inspect checkout'; $(BIN)/redrive inspect checkout; echo; \
	echo '$$ redrive move checkout --task "apps.payments.*"   # a dry run: nothing changes'; \
	$(BIN)/redrive move checkout --task 'apps.payments.*'; echo; \
	echo '$$ redrive --celery-app redrive.sandbox.celery_app:app move default   # routed by the app'; \
	$(BIN)/redrive --celery-app redrive.sandbox.celery_app:app move default

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install
	$(BIN)/mypy

# The in-process tests only (no subprocess, no moto server process): a quick check while
# working. Marks, not folders: tests/conftest.py says why.
unit: install
	$(BIN)/pytest -q -n 4 -m "not e2e"

# Every test, unit and end-to-end; small chunks so that the long ones, sorted first, start
# early (tests/conftest.py, pytest_collection_modifyitems).
suite: install localstack
	$(BIN)/pytest -q -n 4 --maxschedchunk 2 --durations=15

test: lint typecheck docs browser rabbitmq rabbitmq4 postgres suite

# The reference site (docs/, runbooks/ through the docs/runbooks link) built with MkDocs and
# Material into site/: --strict fails on a link to a page or heading that does not exist, or a
# page left out of the nav. Nothing is fetched while building.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# Under CI=true (as CI services set it) a real component that cannot be installed fails the
# run: its tests would only skip, and the run pass without them. Locally they skip.
ci_requires = [ "$(CI)" != true ] || { echo 'CI=true: $(1) is missing, so the run fails' >&2; exit 1; }

# A real component from Debian's packages: $(1) a shell test that it is there, $(2) the
# package, $(3) what skips without it. Installed when missing and this runs as root with
# apt-get (as CI does); otherwise its tests skip and say why, and under CI=true the run fails.
apt_component = $(1) || \
	{ if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo 'installing $(2) for $(3)'; \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(2) >/dev/null 2>&1 || \
	    { apt-get update -qq >/dev/null 2>&1 && \
	      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(2) >/dev/null 2>&1; } || \
	    echo '$(2) could not be installed: $(3) will skip'; \
	  else echo 'no $(2) (and not root with apt-get): $(3) will skip'; fi; }; \
	$(1) || $(call ci_requires,$(2))

# The HTML report's browser test and the console's (tests/test_web_browser.py: Playwright,
# which the test extra installs, drives this Chromium through executable_path; playwright
# install cannot download a browser here) need headless Chromium (Debian's package).
# Installed here when missing and this runs as root with apt-get (as CI does); otherwise
# those tests skip and the summary says why (under CI=true they fail).
browser:
	@$(call apt_component,command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1,chromium,the browser tests)

# The RabbitMQ tests run private nodes of Debian's rabbitmq-server on loopback (tests/conftest.py,
# redrive/sandbox/rabbitmq_node.py). Installed here when missing and this runs as root with
# apt-get (as CI does); otherwise those tests skip and the summary says why (under CI=true
# they fail).
RABBITMQ_SERVER ?= /usr/lib/rabbitmq/bin/rabbitmq-server
rabbitmq:
	@$(call apt_component,test -x $(RABBITMQ_SERVER),rabbitmq-server,the RabbitMQ tests)

# The PostgreSQL ledger's tests run a private server of Debian's postgresql on loopback
# (tests/postgres_server.py). Installed here when missing and this runs as root with apt-get
# (as CI does); otherwise those tests skip and the summary says why (under CI=true they fail).
postgres:
	@$(call apt_component,ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1,postgresql,the PostgreSQL ledger tests)

# RabbitMQ 4.0 beside 3.10 (issue 39): Debian 13's rabbitmq-server 4.0.5 (Erlang 27) in a
# trixie root made by debootstrap, built once (~30-90 s, ~330 MB) outside the clone and
# reused by every later run (.ci/rabbitmq4_root.sh); the tests run a private node from it
# (tests/rabbitmq_shared.py). Not root, or the build failed: the 4.0 tests skip and say why
# (under CI=true, this fails).
RABBITMQ4_ROOT ?= /var/cache/redrive-test/trixie-rabbitmq
export REDRIVE_RABBITMQ4_ROOT := $(RABBITMQ4_ROOT)
rabbitmq4:
	@if [ "$$(id -u)" = 0 ]; then .ci/rabbitmq4_root.sh $(RABBITMQ4_ROOT); \
	elif [ "$$CI" = true ]; then echo 'CI=true: the RabbitMQ 4.0 root needs root to build' >&2; exit 1; \
	elif [ ! -f $(RABBITMQ4_ROOT)/.redrive-root ]; then \
	  echo 'not root: no RabbitMQ 4.0 root is built and the RabbitMQ 4.0 tests will skip'; fi

# The suite with the wall clock two years ahead, subprocesses included: no test may depend on
# today's date. libfaketime from PyPI, because its vendored build sleeps correctly with the
# monotonic clock left alone (Debian's 0.9.10 fails Python's sleeps: EINVAL, or hangs).
# A long cache keeps libfaketime from reading the environment while tests change it.
FAKETIME_AHEAD ?= +730d
test-clock-ahead: install localstack
	$(BIN)/python -m pip install --quiet 'libfaketime>=3,<4'
	LD_PRELOAD="$$($(BIN)/python -c 'import libfaketime, os; print(os.path.join(os.path.dirname(libfaketime.__file__), "vendor", "libfaketime", "src", "libfaketime.so.1"))')" \
	FAKETIME="$(FAKETIME_AHEAD)" FAKETIME_DONT_FAKE_MONOTONIC=1 FAKETIME_CACHE_DURATION=86400 \
	$(BIN)/pytest -q -n 4 -p no:cacheprovider

# test-minimums when pyproject.toml changed since PREVIOUS_MAIN (default: the first parent of
# HEAD, a landing's merge): what .ci/run runs after make test (issue 39, point 4).
PREVIOUS_MAIN ?= HEAD^1
minimums-if-changed:
	@if ! git rev-parse --verify --quiet '$(PREVIOUS_MAIN)^{commit}' >/dev/null; then \
	  echo 'no previous main ($(PREVIOUS_MAIN)) to compare pyproject.toml with: test-minimums not run'; \
	elif git diff --quiet '$(PREVIOUS_MAIN)' HEAD -- pyproject.toml; then \
	  echo 'pyproject.toml unchanged since $(PREVIOUS_MAIN): test-minimums not run'; \
	else echo 'pyproject.toml changed since $(PREVIOUS_MAIN): make test-minimums'; \
	  $(MAKE) test-minimums; fi

# The suite on the lowest version of every dependency pyproject.toml allows (its own venv):
# a floor that admits a release which cannot run is found here, not by a user.
MIN_VENV ?= .venv-min
test-minimums: localstack
	$(PYTHON) -m venv $(MIN_VENV)
	$(MIN_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(PYTHON) .ci/minimum_pins.py > $(MIN_VENV)/constraints.txt
	$(MIN_VENV)/bin/python -m pip install --quiet -c $(MIN_VENV)/constraints.txt -e ".[test]"
	$(MIN_VENV)/bin/pytest -q -n 4 --maxschedchunk 2 --durations=15 -p no:cacheprovider

bench: install
	$(BIN)/python bench/inspect.py
	$(BIN)/python bench/move.py
	$(BIN)/python bench/move.py --latency-ms 20 --sizes 1000 --rounds 2
	$(BIN)/python bench/archive.py

# Where a -w16 move's client CPU goes (py-spy --gil, lean path, loopback): issue 25, item 5.
profile: install
	$(BIN)/python -m pip install --quiet -r requirements/bench.txt
	$(BIN)/python bench/profile_move.py --n 20000 --workers 16

clean:
	rm -rf $(VENV) $(MIN_VENV) $(LOCALSTACK_VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis *.egg-info site
