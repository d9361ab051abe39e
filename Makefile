# Thin wrapper over CMake. `make run` and `make test` do all the set-up on a
# fresh Debian 12 machine: as root they install the missing packages first.

BUILD       ?= build
ASAN_BUILD  ?= build-asan
CLANG_BUILD ?= build-clang
FUZZ_BUILD  ?= build-fuzz
# Seconds each fuzz harness runs in `make test` (tests/fuzz/run.sh).
FUZZ_SECONDS ?= 20
JOBS        ?= $(shell nproc)
CMAKE_ARGS  ?=
# Warnings as errors: off for a developer's `make build`, on in `make test`.
WERROR      ?= OFF

# What building rlorch needs (`make deps-build`; the container images' build
# stages install these and nothing else of this list).
DEB_BUILD_PKGS := build-essential cmake ninja-build pkg-config \
            libuv1-dev libgrpc-dev protobuf-c-compiler libprotobuf-c-dev \
            libyaml-dev libhttp-parser-dev libsqlite3-dev libxxhash-dev libssl-dev libjansson-dev
# Everything `make test` needs: the above, the test tools and the checkers;
# PyYAML and kubectl (`kubectl kustomize`) for the deployment checks;
# iproute2 (ip, tc) for the multi-host test's network namespaces and shaped links;
# numpy and CPU PyTorch for the Python package and the RL example (python3-torch brings
# about 300 packages, 215 MB to download and 900 MB installed: on one Debian
# 12 machine the download took 5 s and unpacking 25 s, a minute or two of
# apt-get install in all).
DEB_PKGS := $(DEB_BUILD_PKGS) git ca-certificates libcriterion-dev sqlite3 prometheus curl python3 \
            python3-yaml clang-14 clang-tidy-14 python3-numpy python3-torch iproute2

.PHONY: all deps deps-build build run test test-unit test-asan test-clang test-fuzz test-gpu bench clean node-deps

all: build

# $(call deps_install,PACKAGES,EXTRA): installs the Debian packages of the list
# that are missing, and EXTRA (shell words appended to $$missing) as root;
# otherwise names them and fails.
define deps_install
	@missing=$$(for p in $(1); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	$(2) \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	  else \
	    echo "missing Debian packages:$$missing (run as root to install them)"; exit 1; \
	  fi; \
	fi
endef

# npm and kubectl may come from elsewhere than Debian: any on PATH will do
# (a kubectl that is not Debian's would clash with kubernetes-client's).
deps:
	$(call deps_install,$(DEB_PKGS),\
	  if ! command -v npm >/dev/null 2>&1; then missing="$$missing nodejs npm"; fi; \
	  if ! command -v kubectl >/dev/null 2>&1; then missing="$$missing kubernetes-client"; fi;)

deps-build:
	$(call deps_install,$(DEB_BUILD_PKGS),)

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja -DRLORCH_WERROR=$(WERROR) $(CMAKE_ARGS)

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

node-deps: deps
	@cd tests/integration/node && { [ -d node_modules/@grpc/grpc-js ] || npm ci --no-audit --no-fund --loglevel=error; }

run: build
	./$(BUILD)/rlorch run --data-dir $(BUILD)/run-data

# The whole suite: unit and integration tests on a normal build, then again
# under AddressSanitizer and UndefinedBehaviorSanitizer, then the clang build
# and the static analysis gate, then a short run of every fuzz harness;
# warnings are errors in every build.
test: deps node-deps
	cmake -S . -B $(BUILD) -G Ninja -DRLORCH_WERROR=ON $(CMAKE_ARGS)
	cmake --build $(BUILD) -j $(JOBS)
	cd $(BUILD) && ctest --output-on-failure -LE gpu -j 2
	$(MAKE) test-asan WERROR=ON
	$(MAKE) test-clang
	$(MAKE) test-fuzz WERROR=ON

test-unit: build
	cd $(BUILD) && ctest --output-on-failure -L unit

# CUDA is left out of the sanitizer build: its runtime does not run under ASan,
# and no GPU code runs where the sanitizers do.
test-asan: deps node-deps
	cmake -S . -B $(ASAN_BUILD) -G Ninja -DRLORCH_SANITIZE=address,undefined \
	      -DRLORCH_WITH_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug -DRLORCH_WERROR=$(WERROR) $(CMAKE_ARGS)
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --output-on-failure -LE gpu -j 2

# The tree with clang 14 (without CUDA), warnings as errors, its unit tests
# run; then clang-tidy's analyser over rpc/, orchestrator/ and workers/ with
# that build's compile_commands.json (tests/lint/tidy.sh).
test-clang: deps
	CC=clang-14 CXX=clang++-14 cmake -S . -B $(CLANG_BUILD) -G Ninja -DRLORCH_WITH_CUDA=OFF \
	      -DRLORCH_WERROR=ON $(CMAKE_ARGS)
	cmake --build $(CLANG_BUILD) -j $(JOBS)
	cd $(CLANG_BUILD) && ctest --output-on-failure -L unit -j 2
	JOBS=$(JOBS) tests/lint/tidy.sh $(CLANG_BUILD)

# The libFuzzer harnesses of tests/fuzz, built with clang 14 (libraries with
# coverage, ASan and UBSan) in a build of their own; each fuzzes FUZZ_SECONDS
# from its seeds, JOBS at a time, and prints its figures. A crash, leak,
# sanitizer report or failed property fails the target and keeps the input
# under $(FUZZ_BUILD)/fuzz/artifacts. Nothing outside the harnesses is started.
test-fuzz: deps
	CC=clang-14 CXX=clang++-14 cmake -S . -B $(FUZZ_BUILD) -G Ninja -DRLORCH_FUZZ=ON \
	      -DRLORCH_WITH_CUDA=OFF -DRLORCH_WERROR=$(WERROR) $(CMAKE_ARGS)
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzz
	JOBS=$(JOBS) tests/fuzz/run.sh $(FUZZ_BUILD) $(FUZZ_SECONDS)

test-gpu: build
	cd $(BUILD) && ctest --output-on-failure -L gpu

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(CLANG_BUILD) $(FUZZ_BUILD)
