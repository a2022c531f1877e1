# watchd — two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
DEBS   := slurmctld slurmd slurm-client munge prometheus-alertmanager prometheus systemd-journal-remote openssl util-linux
DEBS   += postgresql  # the shared state store for HA (tests start a private cluster)
DEBS   += mariadb-server slurmdbd chromium  # Slurm accounting, the HTML report in a real browser
DEBS   += systemd-container debootstrap python3-venv  # the .deb under a real systemd (tests/systemd)
DEBS   += zsh  # the shell completion is tested in bash and zsh
# The Debian package's venv is built with the machine's Debian python3 (docs/packaging.md).
DEB_PYTHON ?= /usr/bin/python3

.PHONY: demo test lint typecheck unit rules-test deps venv bench clean package

$(BIN)/watchd: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

venv: $(BIN)/watchd

demo: venv
	$(BIN)/watchd demo

# As root, installs the Debian packages the real-component tests need when they are missing.
deps:
	@missing=""; for p in $(DEBS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing:$$missing"; apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else echo "missing Debian packages (run as root to install):$$missing"; fi; \
	fi

lint: venv
	$(BIN)/ruff check watchd tests benchmarks
	$(BIN)/ruff format --check watchd tests benchmarks

typecheck: venv
	$(BIN)/mypy

unit: venv
	$(BIN)/pytest -q

# The shipped rule pack: every file valid, every rule test in rules/tests passing.
rules-test: venv
	$(BIN)/watchd rules check rules && $(BIN)/watchd rules test rules/tests/*.yaml

test: deps lint typecheck unit rules-test

# dist/: the sdist and wheel (with the example configs), the dependency-free watchd-client wheel and
# the Debian package watchd_<version>_<arch>.deb (docs/packaging.md). Needs PyPI for the wheels.
package: export PYTHONPATH :=
package:
	rm -rf dist build/tools build/client
	$(DEB_PYTHON) -m venv build/tools
	build/tools/bin/pip install --quiet --disable-pip-version-check build
	build/tools/bin/python -m build --outdir dist .
	mkdir -p build/client/watchd
	cp watchd/client.py build/client/watchd/
	cp clients/watchd-client/pyproject.toml LICENSE build/client/
	build/tools/bin/python -c 'import watchd; print(watchd.__version__)' > build/client/VERSION
	build/tools/bin/python -m build --wheel --outdir dist build/client
	DEB_PYTHON=$(DEB_PYTHON) packaging/build-deb

bench: venv deps
	$(BIN)/python benchmarks/drain_latency.py
	$(BIN)/python benchmarks/kubernetes_drain.py
	$(BIN)/python benchmarks/rules_throughput.py
	$(BIN)/python benchmarks/rule_state.py
	$(BIN)/python benchmarks/ingest_throughput.py
	$(BIN)/python benchmarks/agent_cost.py
	$(BIN)/python benchmarks/heartbeat_cost.py
	$(BIN)/python benchmarks/detection.py
	$(BIN)/python benchmarks/usage_report.py
	$(BIN)/python benchmarks/checks_risk_replay.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build dist
