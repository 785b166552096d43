# gpubox: `make test` runs every tier (the sandbox integration included); `make demo` converges
# and verifies a local sandbox box. Both bootstrap .venv and the host packages themselves.

SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
HOST_PACKAGES := debootstrap systemd-container dpkg-dev apt-utils gnupg openssh-client \
	iproute2 socat curl gcc g++ ccache cmake ninja-build
SRC := src tests deploy inventories benchmarks

.PHONY: all venv host-packages promtool lint unit ops resolver integration test demo demo-down bench clean

all: test

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,sandbox,plot]'
	touch $@

venv: $(VENV)/.installed

host-packages:
	@missing=$$(for p in $(HOST_PACKAGES); do \
		dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing host packages: $$missing"; \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; \
	fi

# promtool, for the alert rules' tests: Debian 12's prometheus package downloaded and unpacked
# under the cache, never installed (it would start a daemon on :9090); .ci/promtool says how.
promtool: host-packages
	@.ci/promtool >/dev/null

lint: venv
	$(BIN)/ruff check $(SRC)
	$(BIN)/ruff format --check $(SRC)
	$(BIN)/mypy src

unit: venv host-packages promtool
	$(BIN)/pytest -q tests/unit

ops: venv
	$(BIN)/pytest -q tests/ops

# apt's real resolver against the driver pin, in private apt roots (needs apt and apt-utils
# only: no box, no network, seconds).
resolver: venv host-packages
	$(BIN)/pytest -q tests/resolver

integration: venv host-packages
	$(BIN)/pytest -q -m integration tests/integration --durations=20

# Every tier. The unit tier runs beside the sandbox integration tier, which spends most of
# its time waiting on its box (about half of the two cores idle): it saves the unit tier's
# five minutes of wall time. Its output is printed when both have ended; either failing
# fails the target.
test: lint ops resolver venv host-packages promtool
	@rm -f .unit-tier.log; \
	( $(BIN)/pytest -q tests/unit --durations=15 > .unit-tier.log 2>&1 ) & unit=$$!; \
	echo "unit tier: running beside the integration tier (PID $$unit), output at the end"; \
	$(BIN)/pytest -q -m integration tests/integration --durations=20; integration=$$?; \
	wait $$unit; unit_rc=$$?; \
	echo "================ unit tier (ran beside the integration tier) ================"; \
	cat .unit-tier.log; \
	echo "unit tier: exit $$unit_rc; integration tier: exit $$integration"; \
	[ $$unit_rc -eq 0 ] && [ $$integration -eq 0 ]

demo: venv host-packages
	$(PY) -m gpubox.commands.demo

demo-down: venv
	$(BIN)/gpubox sandbox down

bench: venv host-packages
	$(PY) benchmarks/deploy_timing.py
	$(PY) benchmarks/time_to_serving.py

clean:
	-$(BIN)/gpubox sandbox down
	rm -rf $(VENV)
