# nfsrdma — the plain entry points. Each target does its own set-up (scripts/setup.sh).
EXPORT ?= ./export
PY := .venv/bin/python
SERVE_ARGS ?=
# The test-bed stage: two VM boots. tests/vmhost proves a failure in the guest fails the host
# (one boot, no knfsd); then every tests/testbed test runs in ONE boot with knfsd, output
# streamed, junit in testbed-out/. TESTBED_TIMEOUT bounds that boot (seconds).
TESTBED_TIMEOUT ?= 3000
define TESTBED_STAGE
$(PY) -m pytest -q -p no:cacheprovider tests/vmhost
$(PY) -m nfsrdma testbed run --knfsd --out testbed-out --timeout $(TESTBED_TIMEOUT) -- \
  $(PY) -m pytest -q -p no:cacheprovider -p no:hypothesispytest -m testbed tests/testbed
endef

# The server's per-request path and the RPC-over-RDMA path compiled with mypyc in place, beside
# their sources (setup.py; about a minute, incremental after the first build; without a C
# compiler, the pure-Python build).
BUILD_IN_PLACE = $(PY) setup.py -q build_ext --inplace

# The host tests run against both builds (setup.py): the compiled selection in place (mypyc; an
# incremental build after the first; nothing is compiled without a C compiler), then, if anything
# was compiled, the pure-Python sources again (NFSRDMA_PURE=1 makes the package ignore compiled
# modules). --tb=native: pytest's own rendering of a compiled frame's traceback fails.
define HOST_TESTS_BOTH_BUILDS
$(BUILD_IN_PLACE)
$(PY) -c 'import nfsrdma; print("host tests, build:", nfsrdma.build())'
$(PY) -m pytest -q --tb=native tests/unit tests/fuzz
if $(PY) -c 'import sys, nfsrdma; sys.exit(not nfsrdma.build().startswith("compiled"))'; \
  then NFSRDMA_PURE=1 $(PY) -m pytest -q tests/unit tests/fuzz; fi
endef

.PHONY: serve test test-host test-testbed bench lint gen setup-serve setup-test

serve: setup-serve
	$(BUILD_IN_PLACE) || echo "nfsrdma: the compiled build failed (above); serving the pure-Python build"
	mkdir -p $(EXPORT)
	$(PY) -m nfsrdma serve $(EXPORT) $(SERVE_ARGS)

test: setup-test
	$(PY) -m nfsrdma.xdr.regen --check
	$(PY) -m ruff check nfsrdma tests bench
	$(PY) -m ruff format --check nfsrdma tests bench
	$(PY) -m mypy
	$(HOST_TESTS_BOTH_BUILDS)
	$(TESTBED_STAGE)

test-host: setup-test
	$(HOST_TESTS_BOTH_BUILDS)

test-testbed: setup-test
	$(TESTBED_STAGE)

bench: setup-test
	@for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

lint: setup-test
	$(PY) -m ruff check nfsrdma tests bench
	$(PY) -m ruff format --check nfsrdma tests bench
	$(PY) -m mypy

gen: setup-test
	$(PY) -m nfsrdma.xdr.regen

setup-serve:
	@scripts/setup.sh serve

setup-test:
	@scripts/setup.sh test
