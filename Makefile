# make run   set everything up, then run the default pipeline end to end (configs/reach.yaml)
# make test  set everything up, then lint, type-check and run the test suite

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.physai-installed
CONFIG ?= configs/reach.yaml
export MUJOCO_GL ?= egl
export PYTHONDONTWRITEBYTECODE := 1

ISAACLAB_VENV ?= .venv-isaaclab
ISAACLAB_STAMP := $(ISAACLAB_VENV)/.physai-installed
LEROBOT_VENV ?= .venv-lerobot
LEROBOT_STAMP := $(LEROBOT_VENV)/.physai-installed
METAWORLD_VENV ?= .venv-metaworld
METAWORLD_STAMP := $(METAWORLD_VENV)/.physai-installed
GYMROBOTICS_VENV ?= .venv-gymnasium-robotics
GYMROBOTICS_STAMP := $(GYMROBOTICS_VENV)/.physai-installed

# The dependencies live in a venv outside the clone, keyed by what decides its contents: a fresh
# clone on a machine that built it once installs in seconds, not minutes. The project itself (and
# the example plugin) live in a thin venv of the clone's own, .venv, which sees the shared
# dependencies through a .pth file: two clones on one machine never import each other's code.
# CACHE= (empty) builds the dependencies inside the clone instead (.venv-deps).
CACHE ?= $(HOME)/.cache/physai-flows
# LAYOUT names the way the venvs are built: a change to it that old venvs lack bumps it. The key
# is what the venv holds (the requirements pyproject.toml declares), not the whole file: a change
# to the linter's contracts or the package list builds no new venv.
LAYOUT := 3
VENV_KEY = $(shell { echo $(LAYOUT); $(PYTHON) scripts/requirements.py $(EXTRAS); } | sha256sum | cut -c1-16)
DEPS = $(if $(CACHE),$(CACHE)/deps-$(VENV_KEY),$(CURDIR)/.venv-deps)
EXTRAS := cosmos,dev,docker,gymnasium,kubernetes,minari,onnxscript,postgres,ray,rl,signing
ISAACLAB_KEY = $(shell sha256sum scripts/install_isaaclab.sh | cut -c1-16)
LEROBOT_KEY = $(shell sha256sum scripts/install_lerobot.sh | cut -c1-16)
METAWORLD_KEY = $(shell { echo metaworld; cat scripts/install_benchmark.sh; } | sha256sum | cut -c1-16)
GYMROBOTICS_KEY = $(shell { echo gymnasium-robotics; cat scripts/install_benchmark.sh; } \
	| sha256sum | cut -c1-16)

.PHONY: run test test-suite lint setup clean isaaclab test-isaaclab lerobot metaworld \
	gymnasium-robotics browser postgres deps deps-locked

run: $(STAMP)
	$(BIN)/flows run $(CONFIG)

# The suite runs on one worker more than the machine has cores, at most four, one test file each
# at a time (a file's module fixtures, its servers and its pipeline runs, stay in one process),
# in collected order: the end-to-end files, the longest, first (tests/conftest.py). Many files
# spend part of their time waiting on servers and subprocesses: the extra worker fills those
# gaps. TEST_JOBS=1 runs it in one.
TEST_JOBS ?= $(shell n=$$(nproc); echo $$(( n < 4 ? n + 1 : 4 )))

# The Isaac Lab and LeRobot venvs build beside the project's venv, not after it (on a machine
# without the cache, minutes of downloading and unpacking run side by side); the lint and type
# check run beside the tests. As root on Debian, podman, runc and mmdebstrap are installed first
# (make containers), so the image and Docker-pool tests build and run the stage images rather
# than skip (tests/e2e/test_images.py, tests/e2e/test_docker_pools.py). The tests that need
# Isaac Lab or LeRobot themselves run in their venvs, each as one test of the suite
# (tests/e2e/test_isaaclab_venv.py, tests/e2e/test_lerobot_venv.py), so a worker runs them
# beside the other files.
test:
	$(MAKE) --no-print-directory -j4 $(STAMP) browser postgres containers $(ISAACLAB_STAMP) \
		$(LEROBOT_STAMP) $(METAWORLD_STAMP) $(GYMROBOTICS_STAMP)
	$(MAKE) --no-print-directory -j2 lint test-suite

# A suite that runs past TEST_BUDGET_S seconds is interrupted (SIGINT) rather than killed by
# whoever waits on it: pytest then still prints what failed and the slowest tests so far. 70
# minutes leave a fresh machine's setup (venvs, Debian packages) inside CI's 90.
TEST_BUDGET_S ?= 4200

test-suite: $(STAMP)
	timeout -s INT -k 120 $(TEST_BUDGET_S) $(BIN)/python -m pytest -q --durations=30 \
		-n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder

# Isaac Lab (kit-less, Newton on CPU) lives in its own venv: its newton pins mujoco 3.12,
# the project needs mujoco 4.0 (scripts/install_isaaclab.sh says how the two are reconciled).
# It is the stage environment `isaaclab` (stages/core/environments.py): `make isaaclab` builds it.
isaaclab: $(ISAACLAB_STAMP)

test-isaaclab: $(ISAACLAB_STAMP)
	PYTHONPATH=. $(ISAACLAB_VENV)/bin/python -m pytest -q -p no:cacheprovider \
		$$(cat tests/isaaclab_tests.txt)

$(ISAACLAB_STAMP): scripts/install_isaaclab.sh
	@if [ -n "$(CACHE)" ] && [ ! -e $(ISAACLAB_VENV) -o -L $(ISAACLAB_VENV) ]; then \
		dir="$(CACHE)/isaaclab-$(ISAACLAB_KEY)" && mkdir -p "$(CACHE)" && \
		flock "$$dir.lock" sh -c 'test -f "$$0/.physai-complete" || { rm -rf "$$0" && \
			bash scripts/install_isaaclab.sh "$$0" && touch "$$0/.physai-complete"; }' "$$dir" && \
		ln -sfn "$$dir" $(ISAACLAB_VENV); \
	else rm -rf $(ISAACLAB_VENV) && bash scripts/install_isaaclab.sh $(ISAACLAB_VENV); fi
	touch $@

# LeRobot 0.6.1 (Python 3.12, torch 2.11) lives in its own venv, built as Isaac Lab's is: once per
# content of scripts/install_lerobot.sh in $(CACHE), linked into the clone. It is the stage
# environment `lerobot` (stages/core/environments.py); its tests are tests/lerobot/.
lerobot: $(LEROBOT_STAMP)

$(LEROBOT_STAMP): scripts/install_lerobot.sh
	@if [ -n "$(CACHE)" ] && [ ! -e $(LEROBOT_VENV) -o -L $(LEROBOT_VENV) ]; then \
		dir="$(CACHE)/lerobot-$(LEROBOT_KEY)" && mkdir -p "$(CACHE)" && \
		flock "$$dir.lock" sh -c 'test -f "$$0/.physai-complete" || { rm -rf "$$0" && \
			bash scripts/install_lerobot.sh "$$0" && touch "$$0/.physai-complete"; }' "$$dir" && \
		ln -sfn "$$dir" $(LEROBOT_VENV); \
	else rm -rf $(LEROBOT_VENV) && bash scripts/install_lerobot.sh $(LEROBOT_VENV); fi
	touch $@

# The manipulation benchmarks' own stage environments, built as LeRobot's is (once per content of
# their install script in $(CACHE), linked into the clone): MetaWorld 3.1.1 pins MuJoCo 3.3.0,
# Gymnasium-Robotics' Fetch code fails on MuJoCo >= 3.12, and the project runs MuJoCo 4.0
# (stages/core/environments.py, docs/benchmarks.md). One script, scripts/install_benchmark.sh,
# installs either; each venv is keyed by the benchmark's name and the script's content.
metaworld: $(METAWORLD_STAMP)
gymnasium-robotics: $(GYMROBOTICS_STAMP)

$(METAWORLD_STAMP): scripts/install_benchmark.sh
	@$(call cached_venv,$(METAWORLD_VENV),metaworld-$(METAWORLD_KEY),scripts/install_benchmark.sh metaworld)
	touch $@

$(GYMROBOTICS_STAMP): scripts/install_benchmark.sh
	@$(call cached_venv,$(GYMROBOTICS_VENV),gymrobotics-$(GYMROBOTICS_KEY),scripts/install_benchmark.sh gymnasium-robotics)
	touch $@

# $(call cached_venv,VENV,NAME,SCRIPT ARGS): SCRIPT ARGS builds VENV once into $(CACHE)/NAME (under a lock,
# a half-built one rebuilt) and VENV links to it; with CACHE= it builds VENV in the clone.
cached_venv = if [ -n "$(CACHE)" ] && [ ! -e $(1) -o -L $(1) ]; then \
		dir="$(CACHE)/$(2)" && mkdir -p "$(CACHE)" && \
		flock "$$dir.lock" sh -c 'test -f "$$0/.physai-complete" || { rm -rf "$$0" && \
			bash $(3) "$$0" && touch "$$0/.physai-complete"; }' "$$dir" && \
		ln -sfn "$$dir" $(1); \
	else rm -rf $(1) && bash $(3) $(1); fi

# The stage environments as container images (flows/images.py): podman, no registry, each layer
# tagged by the content that decides it and built only when missing. IMAGES=physai builds one.
IMAGES ?=
.PHONY: images containers
# The targets that install Debian packages (containers, browser, postgres) run side by side under
# make test's -j4: each apt-get waits for the others (flock) instead of failing on dpkg's lock.
APT_GET := flock /tmp/physai-flows-apt.lock apt-get
images: $(STAMP) containers
	$(BIN)/flows images build $(IMAGES)

# Debian's podman (with runc: crun refuses hybrid cgroups) and mmdebstrap, which the image
# builds and the Docker pools run on; where they cannot be installed (not root, no apt-get),
# `flows images build` names what is missing.
containers:
	@command -v podman >/dev/null && command -v mmdebstrap >/dev/null && command -v runc >/dev/null \
		|| { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && $(APT_GET) update -qq \
		&& DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq podman runc mmdebstrap; } \
		|| echo "podman, runc or mmdebstrap could not be installed: make images cannot build"

# Debian's chromium for the browser test of the UIs (tests/e2e/test_browser_ui.py); where it
# cannot be installed (not root, no apt-get) that test skips.
browser:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
		&& $(APT_GET) update -qq \
		&& DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq chromium; } \
		|| echo "chromium could not be installed: tests/e2e/test_browser_ui.py will skip"

# Debian's PostgreSQL server programs, which tests/e2e/test_concurrency.py runs Prefect and MLflow
# on (a cluster of the test's own in a temporary folder, no system service); where they cannot be
# installed (not root, no apt-get) that test skips.
postgres:
	@ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || command -v pg_ctl >/dev/null \
		|| { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && $(APT_GET) update -qq \
		&& DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq postgresql; } \
		|| echo "PostgreSQL could not be installed: tests/e2e/test_concurrency.py will skip"

# mypy's incremental cache sits beside the venv it describes: a fresh clone re-reads the
# installed packages' types from it instead of from scratch.
lint: $(STAMP)
	$(BIN)/python -m ruff check .
	$(if $(CACHE),MYPY_CACHE_DIR="$(CACHE)/mypy-$(VENV_KEY)") $(BIN)/python -m mypy
	$(BIN)/lint-imports --no-cache --no-logo

setup: $(STAMP)

# The example plugin, a team's own package as it would install it (examples/physai-pointmass).
PLUGIN := examples/physai-pointmass
PLUGIN_FILES := $(PLUGIN)/pyproject.toml $(wildcard $(PLUGIN)/src/*/*.py $(PLUGIN)/src/*/*.xml \
	$(PLUGIN)/src/*/*.yaml $(PLUGIN)/src/*/scenes/*.yaml)

# The shared dependency venv, built once per key (its name holds the key, so an existing one is
# never rebuilt for a fresh clone's newer file times): torch first and pinned (the CPU build; an
# unpinned torch would pull a multi-GB CUDA build), then every dependency and extra
# pyproject.toml declares (scripts/requirements.py lists them), then setuptools for the thin
# venv's editable install. openpi-client, OpenPI's own policy client, tests `flows policy serve`;
# it pins numpy<2, which the rest of the stack cannot take, and its client needs only msgpack
# and websockets.
# Two clones building one key at once take turns (flock): the second finds it complete.
deps:
	@mkdir -p "$(dir $(DEPS))" && flock "$(DEPS).lock" $(MAKE) --no-print-directory deps-locked

deps-locked:
	@test -f "$(DEPS)/.physai-complete" || { rm -rf "$(DEPS)" && \
	$(PYTHON) -m venv "$(DEPS)" && \
	"$(DEPS)/bin/python" -m pip install -q --upgrade pip && \
	"$(DEPS)/bin/python" -m pip install -q torch==2.13.0 && \
	$(PYTHON) scripts/requirements.py $(EXTRAS) > "$(DEPS)/requirements.txt" && \
	"$(DEPS)/bin/python" -m pip install -q -r "$(DEPS)/requirements.txt" 'setuptools>=77' wheel && \
	"$(DEPS)/bin/python" -m pip install -q --no-deps openpi-client==0.1.2 && \
	touch "$(DEPS)/.physai-complete"; }

# The clone's thin venv: its own pip (so `.venv/bin/pip install` puts a plugin here, in this
# clone only), a .pth that adds the shared site-packages, the project editable, and the example
# plugin installed as a user would install theirs (not editable), so the tests run its task the
# way a team's own package runs.
$(STAMP): pyproject.toml $(PLUGIN_FILES) | deps
	rm -rf $(VENV) && $(PYTHON) -m venv $(VENV)
	site=$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))') && \
	deps=$$("$(DEPS)/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))') && \
	echo "import site; site.addsitedir('$$deps')" > "$$site/physai-deps.pth"
	# The dependencies' commands (prefect, mlflow, uvicorn, ray, ...) run under this venv's python,
	# so they see the clone's project and plugins, as in one venv.
	for f in "$(DEPS)"/bin/*; do n=$${f##*/}; \
		if [ ! -e $(BIN)/$$n ] && head -c 200 "$$f" | head -1 | grep -q '^#!.*/python'; then \
			sed '1s|.*|#!$(CURDIR)/$(BIN)/python|' "$$f" > $(BIN)/$$n && chmod +x $(BIN)/$$n; fi; done
	# The venv's bundled setuptools predates SPDX license strings: the shared one builds.
	$(BIN)/python -m pip uninstall -q -y setuptools
	$(BIN)/python -m pip install -q --no-deps --no-build-isolation -e .
	$(BIN)/python -m pip install -q --no-deps --no-build-isolation ./$(PLUGIN)
	touch $@

clean:
	rm -rf .physai
