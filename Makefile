# The two commands of the README, and a few more. Each first makes sure the dependencies are there
# (cmake/deps.sh: finds LibTorch, or installs it once per machine into a cached environment).
#
#   make test            dependencies, configure (preset dev), build into build/, run every test
#   make demo            dependencies, build, run the levels demo (examples/levels.cpp, release build);
#                        DEMO_ARGS=--train-all trains every level, even one its trial found far slower
#   make test PRESET=asan     the same with another preset: release, asan, tsan (build-<preset>/)
#   make plot            draw the metrics files of the last `make demo` into a PNG
#   make bench           release build of bench/ only, run every benchmark; each one's RESULT lines, with
#                        the date, machine, compiler and commit, go to bench/results/<program>.json
#                        (bench/record.py)
#   make sanitize        the unit tests under asan (address + undefined behaviour) and the concurrency
#                        tests (prefetcher and sampler, cache, snapshots) under tsan; builds only the
#                        test programs they run (build-asan/, build-tsan/). CI runs it after `make test`
#   make fuzz            libFuzzer targets of every reader of untrusted files (snapshots, JPEG/PNG, packed
#                        image files, record files, YOLO labels), FUZZ_SECONDS (60) shared among them
#   make docs            docs/benchmarks.md and the README's headline table (between its headline markers)
#                        from the recorded runs in bench/results/ (bench/results_table.py), docs/status.md
#                        (bench/status.py), and the API reference from the headers' /// comments (Doxygen,
#                        build/docs/api/html/index.html; a warning, e.g. an undocumented name, fails it)
#   make examples        release build of every example (build-release/examples/); EXAMPLES_RUN=1 also runs
#                        each twice, small (examples/run_all.sh)
#   make clean
PRESET ?= dev
JOBS ?= $(shell nproc)
BUILD := $(if $(filter dev,$(PRESET)),build,build-$(PRESET))
DEPS := build/deps.cmake
# A recipe's shell command printing the python cmake/deps.sh found (NITRO_PYTHON in $(DEPS)), or nothing.
DEPS_PYTHON := sed -n 's/^set(NITRO_PYTHON "\(.*\)" CACHE.*/\1/p' $(DEPS) 2>/dev/null

.PHONY: test demo plot bench build configure deps clean sanitize fuzz docs examples
.DEFAULT_GOAL := test

deps:
	@cmake/deps.sh $(DEPS) --with-conan

configure: deps
	@mkdir -p $(BUILD)
	@cmake --preset $(PRESET) -C $(DEPS) >$(BUILD)/configure.log 2>&1 || { cat $(BUILD)/configure.log; exit 1; }
	@grep -E '^-- nitro' $(BUILD)/configure.log || true

build: configure
	cmake --build --preset $(PRESET) -j $(JOBS)

test: build
	ctest --preset $(PRESET) -j $(JOBS)

# The demo measures speed, so it is built optimised whatever PRESET says. It writes each level's
# metrics to build-release/demo-metrics/ and draws them (make plot) when matplotlib is there. A level
# that level::Auto's trial measures more than 3x slower than level::Basic here (bf16 on a CPU without
# bf16 arithmetic) is shown from its trial, not trained: DEMO_ARGS=--train-all trains every level,
# DEMO_ARGS="--trial-only-slower-than X" sets the factor (examples/levels.cpp).
DEMO_ARGS ?=
demo:
	$(MAKE) configure PRESET=release
	cmake --build --preset release -j $(JOBS) --target levels
	build-release/examples/levels --metrics build-release/demo-metrics $(DEMO_ARGS)
	@$(MAKE) --no-print-directory plot || echo "make demo: no plot drawn (see above); the metrics files are written"
	@py=$$($(DEPS_PYTHON)); \
	  tb=$$(dirname "$${py:-python3}")/tensorboard; [ -x "$$tb" ] || tb=tensorboard; \
	  echo "make demo: view the runs with:  $$tb --logdir build-release/demo-metrics/tensorboard"; \
	  echo "make demo: the trace: build-release/demo-metrics/basic.trace.json (https://ui.perfetto.dev, Open trace file)"

# Draws the metrics of the last `make demo` (bench/plot_metrics.py, with the python cmake/deps.sh found).
plot:
	@py=$$($(DEPS_PYTHON)); \
	  "$${py:-python3}" bench/plot_metrics.py build-release/demo-metrics/*.jsonl \
	    -o build-release/demo-metrics/metrics.png --window 5 --title "make demo: the levels, CPU"

bench:
	$(MAKE) configure PRESET=release
	cmake --build --preset release -j $(JOBS) --target nitro_benchmarks
	@py=$$($(DEPS_PYTHON)); \
	  for b in build-release/bench/bench_*; do [ -x "$$b" ] && "$${py:-python3}" bench/record.py -- "$$b"; done; true

ASAN_AREAS := core hw data train memory monitor io snapshot optim graph cache image
TSAN_AREAS := data cache io snapshot
space := $(empty) $(empty)
sanitize:
	$(MAKE) configure PRESET=asan
	cmake --build --preset asan -j $(JOBS) --target $(addprefix test_,$(ASAN_AREAS))
	ctest --preset asan -j $(JOBS) -L '^($(subst $(space),|,$(ASAN_AREAS)))$$'
	$(MAKE) configure PRESET=tsan
	cmake --build --preset tsan -j $(JOBS) --target $(addprefix test_,$(TSAN_AREAS))
	ctest --preset tsan -j $(JOBS) -L '^($(subst $(space),|,$(TSAN_AREAS)))$$'

docs: deps
	@py=$$($(DEPS_PYTHON)); \
	  "$${py:-python3}" bench/results_table.py && "$${py:-python3}" bench/status.py
	@command -v doxygen >/dev/null || { echo "make docs: doxygen is missing (apt-get install doxygen)"; exit 1; }
	@mkdir -p build/docs/api
	doxygen docs/Doxyfile
	@echo "make docs: the API reference is build/docs/api/html/index.html"

EXAMPLES_RUN ?=
examples:
	$(MAKE) configure PRESET=release
	cmake --build --preset release -j $(JOBS) --target nitro_examples
	@if [ -n "$(EXAMPLES_RUN)" ]; then bash examples/run_all.sh build-release/examples; fi

FUZZ_SECONDS ?= 60
fuzz: deps
	tests/fuzz/run.sh $(FUZZ_SECONDS)

clean:
	rm -rf build build-*
