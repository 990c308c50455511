# The two commands a new user types: `make setup` (optional) and `make test`.
SHELL := /bin/bash
PY := .venv/bin/python
AIRFLOW_BIN := $(CURDIR)/.venv-airflow/bin
RUNS := $(CURDIR)/.runs
export MLFLOW_TRACKING_URI ?= sqlite:///$(RUNS)/mlflow.db
export AIRFLOW_HOME ?= $(RUNS)/airflow

.PHONY: setup test test-fast test-e2e lint typecheck demo try airflow-ui mlflow-ui bench bench-report lock clean

setup:
	@bash scripts/setup.sh

# Two phases, as CI runs them (.ci/run): the unit tests, then the end-to-end runs (marked slow), each
# in two pytest-xdist processes (measured on 2 cores: the unit phase 183 s against 263 s in one).
# Under `--dist loadgroup` the tests of one `xdist_group` go to one process, which builds what they share once;
# tests/conftest.py puts the tests of a module-scoped fixture in one group. requirements/train.in pins the
# pytest that honours the marks.
# PYTEST_WORKERS=0 runs in one process; one test: .venv/bin/python -m pytest tests/test_x.py::test_y
PYTEST_WORKERS ?= 2
PYTEST_XDIST := -n $(PYTEST_WORKERS) --dist loadgroup
test: setup
	$(PY) -m pytest $(PYTEST_XDIST) -m "not slow"
	$(PY) -m pytest $(PYTEST_XDIST) -m slow

test-fast: setup
	$(PY) -m pytest $(PYTEST_XDIST) -m "not slow"

test-e2e: setup
	$(PY) -m pytest $(PYTEST_XDIST) -m slow

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) scripts/long_functions.py

# mypy: every registered model and strategy implements models/interfaces.py's protocols
# (tests/typecheck/registered.py; pyproject.toml's [tool.mypy]). tests/test_protocols.py runs it too.
typecheck: setup
	$(PY) -m mypy

demo: setup
	bash scripts/demo.sh

# A page to try the registered champions (models/serving/try_launcher.py serves them; the page is Gradio, in
# .venv-try) on http://127.0.0.1:$(TRY_PORT); `make demo` registers them first.
TRY_PORT ?= 7860
try: setup
	$(PY) -m models.serving.try_launcher --host 127.0.0.1 --port $(TRY_PORT)

airflow-ui: setup
	bash scripts/airflow_ui.sh

mlflow-ui: setup
	@mkdir -p $(RUNS)
	$(PY) -m mlflow server --host 127.0.0.1 --port 5000 \
	  --backend-store-uri "$(MLFLOW_TRACKING_URI)" --artifacts-destination "$(RUNS)/mlartifacts"

# All benchmarks at full size (hours on 2 cores); tables on stdout, JSON in benchmarks/results/, then the page.
# The demo's run (kept under .runs/bench-demo/) is also where the synthesis seeds are trained and heard,
# and whose corpus pocketsphinx hears beside the demo's acoustic model (in .venv-benchmarks).
# The run `make bench` keeps of the demo (the newest), which the benchmarks after it read: a shell expression.
BENCH_DEMO_RUN = "$$(dirname "$$(ls -t $(RUNS)/bench-demo/pipeline/*/summary.json | head -1)")"
BENCHMARKS := input_pipeline throughput straggler speedup_model convergence faults time_to_accuracy voice_levers
bench: setup
	@mkdir -p benchmarks/results
	@for b in $(BENCHMARKS); do \
	  echo "== $$b"; \
	  $(PY) benchmarks/$$b.py --json benchmarks/results/$$b.json || exit 1; \
	done
	@echo "== demo"
	$(PY) benchmarks/demo.py --keep $(RUNS)/bench-demo --json benchmarks/results/demo.json
	@echo "== tts_seeds"
	$(PY) benchmarks/tts_seeds.py --json benchmarks/results/tts_seeds.json \
	  --demo-run $(BENCH_DEMO_RUN)
	@echo "== serving (the demo run's acoustic model as served, through its HLG graph, posted its held-out voices)"
	$(PY) benchmarks/serving.py --json benchmarks/results/serving.json \
	  --demo-run $(BENCH_DEMO_RUN)
	@echo "== lm_decoding"
	$(PY) benchmarks/lm_decoding.py --json benchmarks/results/lm_decoding.json \
	  --demo-run $(BENCH_DEMO_RUN)
	@echo "== reference_asr"
	run=$(BENCH_DEMO_RUN); \
	  .venv-benchmarks/bin/python benchmarks/reference_asr.py --data "$$run/corpus/test_engine" \
	  --data "$$run/corpus/test" --ours "$$run" --json benchmarks/results/reference_asr.json
	$(MAKE) bench-report

# docs/benchmarks.md from benchmarks/results/*.json (tables, provenance, plots); tests/test_docs.py
# fails when the committed page is not what this makes of the committed JSON.
bench-report:
	$(PY) benchmarks/report.py

# Re-resolve the lock files after editing requirements/*.in.
lock:
	.venv/bin/pip freeze --exclude-editable | grep -v -e '^-e' -e '^horovod==' > requirements/train.lock
	.venv-airflow/bin/pip freeze --exclude-editable | grep -v '^-e' > requirements/airflow.lock
	.venv-k8s/bin/pip freeze > requirements/k8s.lock
	.venv-try/bin/pip freeze > requirements/try.lock
	.venv-benchmarks/bin/pip freeze > requirements/benchmarks.lock

clean:
	rm -rf .runs .pytest_cache
