# The two commands of the README: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PORT ?= 8000
HOST ?= 127.0.0.1
STAMP := $(VENV)/.installed

.PHONY: run test test-fast install migrate publish devkey bench bench-postgres bench-executors worker runner lint clean up down \
	sandbox-deps browser-deps proxy-deps

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
run: sandbox-deps publish devkey
	$(PY) manage.py cleanup_staged --startup
	$(PY) -m uvicorn orsplatform.asgi:application --host $(HOST) --port $(PORT) \
		--loop uvloop --http orsplatform.perimeter.connections:PerimeterHttpToolsProtocol \
		--no-access-log --timeout-graceful-shutdown 5

test: install sandbox-deps browser-deps proxy-deps
	$(PY) -m pytest

# The tests that need no database, Redis, browser or server (tests/fixtures/tiers.py selects them
# from their fixtures; TCP is refused while they run), on the embedded SQLite settings. The run
# fails when it selects fewer than FAST_MINIMUM tests, so the tier cannot quietly empty out.
FAST_MINIMUM ?= 90
test-fast: install sandbox-deps
	env -u DATABASE_URL -u REDIS_URL -u CELERY_BROKER_URL ORS_TEST_FAST=1 ORS_TEST_FAST_MINIMUM=$(FAST_MINIMUM) \
		$(PY) -m pytest -m "not services" -p no:cacheprovider -q

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
	$(PY) -m celery -A orsplatform worker --beat --pool threads --concurrency 4 --loglevel info

runner: install sandbox-deps
	env -u DATABASE_URL -u SECRET_KEY $(PY) -m celery -A orsplatform.runners.node worker --pool threads \
		--concurrency 8 --hostname $(RUNNER)@%h --without-mingle --without-gossip --loglevel info

lint: install
	$(PY) -m ruff check .

up:
	docker compose -f docker/compose.yml up --build

# compose.yml requires its secrets even to stop the stack; any value does for `down`.
down:
	SECRET_KEY="$${SECRET_KEY:-unused}" REDIS_PASSWORD="$${REDIS_PASSWORD:-unused}" \
		RUNNER_REDIS_PASSWORD_RUNNER_1="$${RUNNER_REDIS_PASSWORD_RUNNER_1:-unused}" \
		RUNNER_REDIS_PASSWORD_RUNNER_2="$${RUNNER_REDIS_PASSWORD_RUNNER_2:-unused}" docker compose -f docker/compose.yml down

clean:
	rm -rf var .pytest_cache
