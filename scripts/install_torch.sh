#!/bin/sh
# Installs the CPU build of torch into the Python at $PY (make install runs this first, so that no
# other dependency pulls PyPI's default multi-GB CUDA build).
#   TORCH_INDEX_URL=...  take torch from that index (a mirror, or a CUDA index on a GPU machine)
#   otherwise            a local torch wheel that pip is configured to find (find-links) if there
#                        is one, else PyTorch's CPU index. torch's own dependencies come from the
#                        usual indexes either way.
set -eu
PY=${PY:-python3}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
TORCH_INDEX_URL=${TORCH_INDEX_URL:-}
if [ -n "$TORCH_INDEX_URL" ]; then
    exec "$PY" -m pip install -q "torch==$TORCH_VERSION" --index-url "$TORCH_INDEX_URL"
fi
local_dir=$(mktemp -d)
trap 'rm -rf "$local_dir"' EXIT
if "$PY" -m pip download -q --no-index --no-deps "torch==$TORCH_VERSION" -d "$local_dir" 2>/dev/null; then
    "$PY" -m pip install -q "$local_dir"/torch-*.whl
else
    "$PY" -m pip install -q "torch==$TORCH_VERSION" --index-url https://download.pytorch.org/whl/cpu
fi
