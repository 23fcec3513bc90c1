#!/usr/bin/env bash
# llama.cpp's llama-server for benchmarks/bench_llamacpp.py, built from the llama-cpp-python
# sdist's vendored source (PyPI: no git, no model hub) with llama.cpp's kernels for the CPU it
# runs on (GGML_NATIVE), as in docs/benchmarks.md's 2026-12-03 runs, and llama-quantize beside
# it (bench_llamacpp --quant TYPE requantises the embedded model with it; it also makes K-quant
# GGUFs of any model). Prints llama-server's path (llama-quantize is in the same directory;
# everything else goes to stderr); an existing build is reused. About 11 min on 2 cores.
#
#   LLAMA_SERVER=$(bash scripts/build_llama_server.sh [DIR]) python -m benchmarks.bench_llamacpp
#
# DIR defaults to $SPECSERVE_CACHE/llama.cpp-VERSION (SPECSERVE_CACHE: ~/.cache/specserve);
# LLAMA_CPP_PYTHON_VERSION picks another sdist (default 0.3.36).
set -euo pipefail
version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
dir="${1:-${SPECSERVE_CACHE:-$HOME/.cache/specserve}/llama.cpp-$version}"
src="$dir/llama_cpp_python-$version/vendor/llama.cpp"
bin="$src/build/bin/llama-server"
if [[ -x $bin && -x $(dirname "$bin")/llama-quantize ]]; then
  echo "$bin"
  exit 0
fi
cd "$(dirname "$0")/.."
python="python3"
[[ -x .venv/bin/python ]] && python=.venv/bin/python
mkdir -p "$dir"
"$python" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$dir" >&2
[[ -d $src ]] || tar xzf "$dir/llama_cpp_python-$version.tar.gz" -C "$dir"
cmake -S "$src" -B "$src/build" -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >&2
cmake --build "$src/build" --target llama-server llama-quantize -j"$(nproc)" >&2
echo "$bin"
