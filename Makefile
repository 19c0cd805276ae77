# Thin wrapper over CMake/Ninja/ctest. The real logic lives in scripts/; see docs/BUILDING.md.
#
#   make build        dependencies, configure (Ninja, build/), build
#   make test         main tree + ASan/UBSan + TSan trees, all ctest runs, "N passed, N failed"
#   make test-fast    main tree only
#   make demo         build, then run examples/demo on 4 ranks and examples/moe_layer on 2, compare
#                     all_reduce with Open MPI and gloo (table + plot, its path printed), recover a rank
#   make install PREFIX=/opt/strata
#   make format | format-check | lint | clean
#
# Variables (make VAR=value): BUILD_DIR ASAN_DIR TSAN_DIR PREFIX JOBS CTEST_JOBS CTEST_ARGS
# SANITIZER_CTEST_ARGS CMAKE_ARGS. JOBS is the compile parallelism (empty: ninja's default);
# CTEST_JOBS the tests run at once (2 suits a 2-core machine, as tests start several ranks).

BUILD_DIR ?= build
ASAN_DIR ?= build-asan
TSAN_DIR ?= build-tsan
PREFIX ?= /usr/local
JOBS ?=
CTEST_JOBS ?= 2
CTEST_ARGS ?=
SANITIZER_CTEST_ARGS ?= -LE slow|multihost
CMAKE_ARGS ?=
# bench-moe-serve: 1 also runs the cross-host rows (network namespaces, root)
MULTIHOST ?= 1
CLANG_FORMAT ?= clang-format
CLANG_TIDY ?= clang-tidy

export BUILD_DIR ASAN_DIR TSAN_DIR JOBS CTEST_JOBS CTEST_ARGS SANITIZER_CTEST_ARGS CMAKE_ARGS

FORMAT_DIRS := src include tests bench examples python
FORMAT_FILES = find $(FORMAT_DIRS) -type f \( -name '*.cpp' -o -name '*.hpp' -o -name '*.h' -o -name '*.cc' \) -print0
NINJA_JOBS := $(if $(JOBS),-j $(JOBS),)

.PHONY: all deps configure build test test-fast demo bench bench-multihost bench-moe bench-moe-serve bench-recovery bench-recovery-torch profile install format format-check lint clean

all: build

deps:
	@scripts/install_deps.sh

# Configure once; afterwards ninja re-runs CMake by itself when a CMakeLists.txt changes.
configure: deps
	@if [ ! -f $(BUILD_DIR)/build.ninja ]; then \
	  cmake -S . -B $(BUILD_DIR) -G Ninja $(CMAKE_ARGS); \
	fi

build: configure
	cmake --build $(BUILD_DIR) $(NINJA_JOBS)

test: deps
	@scripts/run_tests.sh main asan tsan

test-fast: deps
	@scripts/run_tests.sh main

# the comparison needs bench/peers/mpi_bench (built with the tree when Open MPI is installed)
demo: build
	@if [ ! -f examples/demo.cpp ]; then \
	  echo "make demo: examples/demo.cpp does not exist yet (the demo is still being written)"; \
	  exit 1; \
	fi
	@if [ ! -x $(BUILD_DIR)/examples/demo ]; then \
	  echo "make demo: $(BUILD_DIR)/examples/demo was not built (add it to examples/CMakeLists.txt)"; \
	  exit 1; \
	fi
	./$(BUILD_DIR)/strata run -n 4 ./$(BUILD_DIR)/examples/demo
	@echo
	@echo "--- examples/moe_layer: an MoE feed-forward layer (router, dispatch, SwiGLU experts, combine) ---"
	./$(BUILD_DIR)/strata run -n 2 ./$(BUILD_DIR)/examples/moe_layer --tokens 512 --hidden 512 --ffn 256 --steps 4
	@echo
	@echo "--- all_reduce on 4 ranks: Strata next to Open MPI and gloo (when installed), quick sweep ---"
	@/usr/bin/python3 scripts/demo_compare.py $(BUILD_DIR) $(BUILD_DIR)/demo || echo "(comparison failed; the demo goes on)"
	@echo
	@echo "--- failure recovery: 4-rank data-parallel training, rank 2 SIGKILLed at step 10;"
	@echo "    only rank 2 is replaced, it restores from a replica, the step is redone"
	./$(BUILD_DIR)/strata run --ft -n 4 ./$(BUILD_DIR)/examples/train_dp --steps 20 --quiet --fail 2:10:kill
	@echo "    (reference without failure:)"
	@./$(BUILD_DIR)/strata run -n 4 ./$(BUILD_DIR)/examples/train_dp --steps 20 --quiet | grep "final params"

QUICK ?= 0
# strata vs Open MPI / gloo / memcpy in one run; rewrites docs/PERFORMANCE.md + docs/perf_*.png
# (~13 min on an idle 2-core machine; make bench QUICK=1 for ~2 min)
bench: deps
	@scripts/install_bench_deps.sh
	@if [ ! -f $(BUILD_DIR)/build.ninja ]; then \
	  cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS); \
	fi
	cmake --build $(BUILD_DIR) $(NINJA_JOBS)
	BUILD_DIR=$(BUILD_DIR) JOBS=$(JOBS) QUICK=$(QUICK) scripts/bench_all.sh

# Between hosts (network namespaces, root): strata vs Open MPI, all_reduce + all_to_all, with a
# TCP link probe, 2 ranks per host and 1; rewrites docs/PERFORMANCE_MULTIHOST.md + its plot
bench-multihost: build
	@scripts/install_bench_deps.sh
	cmake -S . -B $(BUILD_DIR) >/dev/null
	BUILD_DIR=$(BUILD_DIR) QUICK=$(QUICK) scripts/bench_multihost.sh
	BUILD_DIR=$(BUILD_DIR) ROUNDS=$(if $(filter 1,$(QUICK)),1,3) scripts/bench_lanes.sh

# perf profiles of the cases that miss a performance target; rewrites docs/PROFILE.md (~1 min)
profile: build
	@scripts/install_bench_deps.sh
	BUILD_DIR=$(BUILD_DIR) scripts/profile_hotspots.sh

# Recovery figures (detection, RTO and its breakdown at 4-64 ranks vs restart-all + checkpoint);
# then across 2 and 3 namespace hosts (root); rewrites docs/RECOVERY.md (but its PyTorch section)
# + docs/recovery_rto.png (~8 min)
bench-recovery: build
	@scripts/install_bench_deps.sh
	/usr/bin/python3 scripts/bench_recovery.py --build $(BUILD_DIR)
	/usr/bin/python3 scripts/bench_recovery_multihost.py --build $(BUILD_DIR)

# PyTorch DDP recovery (strata, strata + hot spare, torchrun --max_restarts 1 at 2, 4, 8 ranks);
# rewrites the PyTorch section of docs/RECOVERY.md only (~4 min)
bench-recovery-torch: build
	/usr/bin/python3 scripts/bench_ddp_recovery.py --build $(BUILD_DIR) --ranks 2,4,8,32 --repeats 2

# MoE dispatch/combine: strata schedules vs Relay vs Open MPI at 2, 4, 8 ranks; rewrites
# docs/PERFORMANCE_MOE.md, docs/perf_moe.png and the MoE section of docs/PERFORMANCE.md
bench-moe: deps
	@scripts/install_bench_deps.sh
	@if [ ! -f $(BUILD_DIR)/build.ninja ]; then \
	  cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS); \
	fi
	BUILD_DIR=$(BUILD_DIR) JOBS=$(JOBS) QUICK=$(QUICK) scripts/bench_moe.sh

# MoE serving: TTFT/TPOT p50/p99 of examples/moe_serve (strata Prefill+Decode, Relay) and its Open
# MPI peer at 2 and 4 ranks on this host and on 2 network-namespace hosts x 1 and x 2 ranks (needs
# root; MULTIHOST=0 for this host only); rewrites the serving section of docs/PERFORMANCE_MOE.md
# (~5 min)
bench-moe-serve: deps
	@scripts/install_bench_deps.sh
	cmake -S . -B $(BUILD_DIR) -G Ninja $(CMAKE_ARGS) >/dev/null
	cmake --build $(BUILD_DIR) --target strata_cli moe_serve $(NINJA_JOBS)
	@if grep -q 'build bench/peers/mpi_moe_serve:' $(BUILD_DIR)/build.ninja; then \
	  cmake --build $(BUILD_DIR) --target mpi_moe_serve $(NINJA_JOBS); \
	fi
	/usr/bin/python3 scripts/bench_moe_serve.py --build $(BUILD_DIR) $(if $(filter 1,$(MULTIHOST)),--multihost)

install: build
	cmake --install $(BUILD_DIR) --prefix $(PREFIX)

format:
	$(FORMAT_FILES) | xargs -0 -r $(CLANG_FORMAT) -i

# Fails, naming each file, when a source file differs from .clang-format (.ci/run runs it).
format-check:
	@command -v $(CLANG_FORMAT) >/dev/null || { echo "format-check: $(CLANG_FORMAT) not found (scripts/install_deps.sh installs clang-format)"; exit 1; }
	@bad=$$($(FORMAT_FILES) | xargs -0 -r -n 1 sh -c '$(CLANG_FORMAT) --dry-run -Werror "$$0" >/dev/null 2>&1 || echo "$$0"'); \
	if [ -n "$$bad" ]; then echo "format-check: these files differ from .clang-format (run make format):"; echo "$$bad" | sed 's/^/  /'; exit 1; fi; \
	echo "format-check: every source file matches .clang-format"

# clang-tidy over the library sources, with the flags of the main build.
lint: configure
	find src -type f -name '*.cpp' -print0 | \
	  xargs -0 -r -n 4 -P $$(nproc) $(CLANG_TIDY) -p $(BUILD_DIR) --quiet

clean:
	rm -rf $(BUILD_DIR) $(ASAN_DIR) $(TSAN_DIR) build-pip python/strata.egg-info
