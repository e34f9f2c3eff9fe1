# The two commands of the README: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PORT ?= 8000
HOST ?= 127.0.0.1
STAMP := $(VENV)/.installed

.PHONY: run test test-fast install migrate publish devkey bench bench-postgres bench-executors worker runner lint clean up down \
	sandbox-deps browser-deps proxy-deps containers-deps stack-test test-changed

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

# Debian packages beyond the virtualenv, installed only when missing (bin/system-deps): bubblewrap
# for the tenant sandbox, Debian's chromium with its driver for the browser tests, and nginx for the
# perimeter's proxy tests (docker/nginx).
sandbox-deps:
	@bin/system-deps sandbox

browser-deps:
	@bin/system-deps browser

proxy-deps:
	@bin/system-deps proxy

# Docker's engine, gVisor's runsc and debootstrap for container environments (docs/containers.md).
# Without them (or without root) container versions fail to build saying why; Python ones work.
containers-deps:
	@bin/system-deps containers

migrate: install
	mkdir -p var
	$(PY) manage.py migrate --noinput

publish: migrate
	$(PY) manage.py publish_envs

devkey: publish
	@$(PY) manage.py dev_key

# The perimeter's protocol: httptools with a header deadline and a connection cap (docs/perimeter.md).
# cleanup_staged --startup: what a killed server left (staged uploads, ingests and builds it was
# running) is removed or failed before the server serves again (docs/uploads.md).
# Without REDIS_URL or CELERY_BROKER_URL (the embedded default) the platform worker with beat runs
# beside the server on the filesystem broker (a folder: nothing to install or start), so builds,
# replays, evaluation runs and every scheduled task run here too, and it stops with the server
# (docs/runner-nodes.md). With a broker, the worker is started on its own (`make worker`).
WORKER_CMD = $(PY) -m celery -A orsplatform worker --beat --pool threads --concurrency 4 \
	--schedule var/celerybeat-schedule --without-mingle --without-gossip
SERVER_CMD = $(PY) -m uvicorn orsplatform.asgi:application --host $(HOST) --port $(PORT) \
	--loop uvloop --http orsplatform.perimeter.connections:PerimeterHttpToolsProtocol \
	--no-access-log --timeout-graceful-shutdown 5 --ws-per-message-deflate false
run: sandbox-deps containers-deps publish devkey
	$(PY) manage.py cleanup_staged --startup
	@if [ -n "$$REDIS_URL$$CELERY_BROKER_URL" ]; then exec $(SERVER_CMD); fi; \
	$(WORKER_CMD) --loglevel warning & worker=$$!; \
	trap 'kill $$worker 2>/dev/null; wait $$worker' EXIT INT TERM; \
	$(SERVER_CMD)

# The whole suite, in TEST_WORKERS pytest-xdist processes (each has its own database, Redis prefix,
# ports and var/: tests/fixtures/workers.py); most of a test's time is spent waiting on servers,
# sandboxes and builds, so more workers than cores pay off, and `worksteal` hands the long tests'
# files around as workers fall idle. The first pass's failures run again alone (bin/test-suite says
# why); TEST_WORKERS=0 runs the suite in one process, once. docs/testing.md has the figures.
TEST_WORKERS ?= 4
test: install sandbox-deps browser-deps proxy-deps containers-deps
	PY=$(PY) TEST_WORKERS=$(TEST_WORKERS) bin/test-suite

# The tests that touch what changed since this branch left main (commits, edits, new files), chosen
# from the import graph and the apps' test folders (tools/test_changed.py; `--list` says why).
test-changed: install sandbox-deps
	env -u PYTHONDONTWRITEBYTECODE $(PY) tools/test_changed.py --workers $(or $(filter-out 0,$(TEST_WORKERS)),3)

# docker/compose.yml on real containers (installs docker.io, debootstrap and docker-compose when
# missing, starts its own dockerd if none answers, builds a local Debian base when the registry's
# images cannot be pulled), then tests/stack through its proxy; always tears everything down
# (bin/stack-test, docs/stack-test.md).
stack-test: install
	PY=$(PY) bin/stack-test

# The tests that need no database, Redis, browser or server (tests/fixtures/tiers.py selects them
# from their fixtures; TCP is refused while they run), on the embedded SQLite settings. The run
# fails when it selects fewer than FAST_MINIMUM tests, so the tier cannot quietly empty out.
FAST_MINIMUM ?= 90
test-fast: install sandbox-deps
	env -u DATABASE_URL -u REDIS_URL -u CELERY_BROKER_URL -u PYTHONDONTWRITEBYTECODE ORS_TEST_FAST=1 \
		ORS_TEST_FAST_MINIMUM=$(FAST_MINIMUM) $(PY) -m pytest -m "not services" -p no:cacheprovider -q

bench: install sandbox-deps
	$(PY) bench/compare.py --concurrency 16 --duration 20

bench-postgres: install sandbox-deps
	$(PY) bench/compare.py --concurrency 16 --duration 20 --postgres

bench-executors: install sandbox-deps
	$(PY) bench/compare_executors.py --concurrency 16 --duration 20

# The celery executor on one box (REDIS_URL, DATABASE_URL and ORS_EXECUTOR=celery set for `run` too):
# the platform worker with beat, and a runner node (start several with different RUNNER names).
RUNNER ?= runner1
worker: install
	mkdir -p var
	$(WORKER_CMD) --loglevel info

runner: install sandbox-deps
	env -u DATABASE_URL -u SECRET_KEY $(PY) -m orsplatform.executors.node --hostname $(RUNNER)@%h --loglevel info

lint: install
	$(PY) -m ruff check .

up:
	docker compose -p ors-platform -f docker/compose.yml up --build

# compose.yml requires its secrets even to stop the stack; any value does for `down`.
down:
	SECRET_KEY="$${SECRET_KEY:-unused}" REDIS_PASSWORD="$${REDIS_PASSWORD:-unused}" \
		RUNNER_REDIS_PASSWORD_RUNNER_1="$${RUNNER_REDIS_PASSWORD_RUNNER_1:-unused}" \
		RUNNER_REDIS_PASSWORD_RUNNER_2="$${RUNNER_REDIS_PASSWORD_RUNNER_2:-unused}" docker compose -p ors-platform -f docker/compose.yml down

clean:
	rm -rf var .pytest_cache

# The documentation site (docs/, mkdocs.yml) into var/site; docs/configuration.md is generated from the
# settings registry (orsplatform/config.py) first. `$(PY) -m mkdocs serve` to read it while editing.
.PHONY: site
site: install
	$(PY) -m orsplatform.config --markdown > docs/configuration.md
	$(PY) -m mkdocs build --strict -d var/site
