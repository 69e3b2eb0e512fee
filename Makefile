# Every install step of the project lives here: a fresh machine needs only python3, go and
# iproute2 (all on this kind of machine) and the package registries.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: ui-pictures install-yaml chaos venv bins demo test lint bench clean constraints

$(STAMP): pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]'
	# vllm-router 0.1.15, the release gpustack pins, beside the venv's 0.1.17 (same package
	# name, so in its own directory; it uses 0.1.17's dependencies): testbed/bed.py runs it.
	$(BIN)/pip install --quiet --no-deps --upgrade --target $(VENV)/vllm-router-0.1.15 vllm-router==0.1.15
	touch $(STAMP)

venv: $(STAMP)

# Real control-plane binaries, built once into ~/.cache/llm-retire (keyed by version).
bins:
	bash testbed/build.sh
	bash testbed/build_kustomize.sh >/dev/null

# The main job on the embedded default: Temporal dev server + UI and the local cluster.
demo: venv bins
	$(BIN)/python -m testbed demo

# The whole suite: lint, types, then every test (unit, time-skipping, dev server, bed).
# pytest exits 5 when it ran no test; that is a failure here, as any non-zero code is.
test: venv bins
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m pytest

# Benchmarks: `make bench` runs all; `make bench BENCH="watcher --fleets 10,100"` one.
BENCH ?=
bench: venv bins
	$(BIN)/python -m bench $(BENCH)

# The fault campaign (issue 19): `make chaos` runs a long one; CHAOS="--seed 5 --minutes 5"
# changes it.  Its report and timeline go to chaos/results/seed-N/.
CHAOS ?= --seed 3 --minutes 24 --deployments 12 --pace 2
chaos: venv bins
	$(BIN)/python -m chaos $(CHAOS)

# Pictures of the real Temporal UI for docs/operating.md (docs/img/ui-*.png): the demo
# without its own retirement, then testbed/ui_story.py drives two retirements and headless
# Chromium photographs them (the Debian package, installed when absent).
ui-pictures: venv bins
	command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium)
	mkdir -p .bed; $(BIN)/python -m testbed demo --no-retire > .bed/ui-demo.log 2>&1 & demo=$$!; \
	  for i in $$(seq 240); do grep -q "everything keeps running" .bed/ui-demo.log && break; sleep 1; done; \
	  $(BIN)/python -m testbed.ui_story; status=$$?; kill -INT $$demo; wait $$demo; exit $$status

# One rendered manifest per overlay (dist/install-<overlay>.yaml), for a release's assets:
#   kubectl apply --server-side -f dist/install-in-cluster-temporal.yaml
install-yaml: bins
	mkdir -p dist
	set -e; k=$$(bash testbed/build_kustomize.sh); for o in deploy/overlays/*/; do \
	  $$k build $$o > dist/install-$$(basename $$o).yaml; done; ls dist

# Re-pin every distribution after a dependency change in pyproject.toml.
constraints:
	$(BIN)/pip install --quiet -e '.[dev]'
	{ sed -n '/^#/p' constraints.txt; $(BIN)/pip freeze --exclude-editable | grep -v '^#'; } > constraints.new
	mv constraints.new constraints.txt

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
