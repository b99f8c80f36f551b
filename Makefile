# Thin wrapper over CMake. Two entry points for a fresh Debian machine (as root):
#   make serve   install packages, build, check the shipped default pair, serve it on 127.0.0.1:8080
#   make check   install packages, build, run the whole test suite (and again under ASan+UBSan),
#                and build the Release and MinSizeRel types (a build type a user picks must not break)
BUILD       ?= build
ASAN_BUILD  ?= build-asan
FUZZ_BUILD  ?= build-fuzz
FUZZ_SECONDS ?= 15
JOBS        ?= $(shell nproc)
# the shipped default pair (artifacts/default, trained by scripts/train/build_default.sh): a Qwen3
# target and its DFlash b8 drafter; DRAFT= (empty) serves the target alone
MODEL       ?= artifacts/default/target
DRAFT       ?= artifacts/default/dflash-b8
HOST        ?= 127.0.0.1
PORT        ?= 8080
APT_PACKAGES = build-essential cmake pkg-config libcivetweb-dev libcjson-dev libcmocka-dev \
               libpcre2-dev python3 python3-numpy python3-jinja2 python3-yaml
FUZZ_PACKAGES = clang libclang-rt-14-dev

.PHONY: all deps build serve check check-fast check-asan check-release check-fuzz soak model bench train-default clean

all: build

# Installs what is missing (no-op when everything is there).
deps:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q "ok installed" || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi

build: deps
	@echo "==> building graphswap in $(BUILD)/ (cmake, RelWithDebInfo, $(JOBS) jobs)"
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo
	cmake --build $(BUILD) -j $(JOBS)

# The default pair ships in the repository; its files must match their manifest.
model: build
	@echo "==> checking the default pair in artifacts/default/ against MANIFEST.sha256"
	cd artifacts/default && sha256sum --quiet -c MANIFEST.sha256
	@test -f $(MODEL)/config.json || { echo "no checkpoint at MODEL=$(MODEL)" >&2; exit 2; }

serve: model
	@echo "==> serving $(MODEL)$(if $(DRAFT), with the drafter $(DRAFT)) on http://$(HOST):$(PORT) (Ctrl-C stops; OpenAI API under /v1, metrics at /metrics)"
	$(BUILD)/graphswap serve --model $(MODEL) $(if $(DRAFT),--draft $(DRAFT)) --host $(HOST) --port $(PORT)

check-fast: build
	cd $(BUILD) && GRAPHSWAP_CHECKED=1 ctest --output-on-failure -j $(JOBS)

check-asan: deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DGS_SANITIZE=ON
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && GRAPHSWAP_CHECKED=1 ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --output-on-failure -j $(JOBS) -L 'unit|integration|reference'

# Release (-O3, NDEBUG: assert-only variables, -Wformat-truncation) with its unit tests, and
# MinSizeRel (-Os) CPU-only, build only.
check-release: deps
	cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release
	cmake --build build-release -j $(JOBS)
	cd build-release && ctest --output-on-failure -j $(JOBS) -L unit
	cmake -S . -B build-minsizerel -DCMAKE_BUILD_TYPE=MinSizeRel -DGS_CUDA=OFF
	cmake --build build-minsizerel -j $(JOBS)

# libFuzzer targets (tests/fuzz), FUZZ_SECONDS each from the committed corpora; fails on a crash
check-fuzz: deps
	@$(MAKE) --no-print-directory deps APT_PACKAGES="$(FUZZ_PACKAGES)"
	CC=clang cmake -S . -B $(FUZZ_BUILD) -DGS_FUZZ=ON -DGS_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzz
	FUZZ_SECONDS=$(FUZZ_SECONDS) tests/fuzz/run.sh $(FUZZ_BUILD)

check: check-fast check-asan check-release check-fuzz

# weight updates under generation load (not part of check; GS_BIN=build-asan/graphswap for ASan)
soak: build
	GS_BIN=$${GS_BIN:-$(BUILD)/graphswap} /usr/bin/python3 tests/soak/soak.py

bench: model
	$(BUILD)/graphswap bench decode --model $(MODEL)

# Retrains the default pair from scratch (torch from PyPI in build-train/venv; about 75 min on 2 cores)
train-default: build
	bash scripts/train/build_default.sh

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD) build-release build-minsizerel
