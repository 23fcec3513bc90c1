#!/usr/bin/env bash
# Reproduce docs/benchmarks.md: engine vs HF, batch-1 speculation, goodput sweep, policies,
# attention, suffix/scored drafts, KV pressure, the soak, serve against a fleet (mixed traffic).
# Needs a quiet machine: every part compares configurations side by side in one run.
# Every benchmark is a module of benchmarks/, run from the repo root: python -m benchmarks.NAME.
# Usage: bash scripts/run_benchmarks.sh
#        [engine|baseline|serving|llamacpp|spec|copy|kernels|goodput|policy|structured|attention|
#         suffix|eagle|cache|kv|soak|fleet|all]
#        [OUT=bench-out]   (raw outputs: ignored by git; docs/benchmarks.md quotes them)
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
what="${1:-all}"
out="${2:-bench-out}"
mkdir -p "$out"
threads="${THREADS:-2}"  # torch threads of the benchmarked process / server

if [[ $what == engine || $what == all ]]; then
  python -m benchmarks.engine_bench --threads "$threads" --repeats 3 --json "$out/engine.json" \
    | tee "$out/engine.md"
fi

if [[ $what == baseline || $what == all ]]; then
  # The same engine benchmark on an earlier commit (BASE_REV), run from a throwaway worktree
  # with this venv, right after this tree's: "before" and "after" on one machine in one run.
  base="${BASE_REV:-26d7662}"
  tree=$(mktemp -d)
  git worktree add --detach "$tree" "$base" >/dev/null
  # Our engine only (--only ours: the GGUF blocks), each in its own interpreter. The base runs
  # inside its tree, so that `python -m` imports its specserve (the current directory comes
  # first on sys.path), with its own engine_bench: specserve/bench/ before issue 20 moved it.
  bench=benchmarks.engine_bench
  [[ -f $tree/benchmarks/engine_bench.py ]] || bench=specserve.bench.engine_bench
  (cd "$tree" && python -m "$bench" --threads "$threads" --repeats 3 --only ours \
    --json "$OLDPWD/$out/engine-base.json")
  python -m benchmarks.engine_bench --threads "$threads" --repeats 3 --only ours \
    --json "$out/engine-head.json"
  git worktree remove --force "$tree"
fi

if [[ $what == serving || $what == all ]]; then
  # The serving path against the engine in process (issue 21): this tree, then SERVING_BASE_REV
  # (before the hand-over fix) from a throwaway worktree, each side of each run in one process
  # after the other. Neither sets OMP_WAIT_POLICY: both sides run with the same environment.
  python -m benchmarks.bench_serving --threads 1,2 --concurrency 1,16 \
    --json "$out/serving.json" | tee "$out/serving.md"
  # Why some batch-1 steps run slow in process (the ITL tail): each step beside its threads'
  # run-queue wait and the other tasks that ran meanwhile.
  for t in 2 1; do
    python -m benchmarks.step_stalls --threads "$t" --requests 16 --json "$out/stalls-t$t.json" \
      | tee "$out/stalls-t$t.md"
  done
  base="${SERVING_BASE_REV:-6178f74}"
  tree=$(mktemp -d)
  git worktree add --detach "$tree" "$base" >/dev/null
  # This tree's benchmark against the base's specserve: run inside the base's tree, with this
  # tree's benchmarks/ copied in.
  rm -rf "$tree/benchmarks" && cp -r benchmarks "$tree/benchmarks"
  (cd "$tree" && python -m benchmarks.bench_serving --threads 2 --no-loop-writes \
    --concurrency 1,16 --json "$OLDPWD/$out/serving-base.json") | tee "$out/serving-base.md"
  git worktree remove --force "$tree"
fi

if [[ $what == llamacpp || $what == all ]]; then
  # Against llama-server on the same GGUF (issues 21, 22): batch 1 in each numerics, 16 at once
  # against -np 16, verify cost. Needs LLAMA_SERVER (LLAMA_SERVER=$(bash
  # scripts/build_llama_server.sh) builds one, ~11 min); else it says so.
  python -m benchmarks.bench_llamacpp --threads "$threads" --json "$out/llamacpp.json" \
    | tee "$out/llamacpp.md"
fi

if [[ $what == spec || $what == all ]]; then
  python -m benchmarks.spec_bench --threads "$threads" --speculate 0,1,2,3,5,8 \
    --prompts-per-workload 3 --new-tokens 128 --json "$out/spec.json" | tee "$out/spec.md"
fi

serve_bg() {  # serve_bg PORT ARGS... : start a server (2 threads; the load generator has none)
  local port=$1; shift
  # OpenMP's default wait policy: with OMP_WAIT_POLICY=PASSIVE every parallel region starts by
  # waking a sleeping thread, which cost batch-1 decode 2.5x once the layers ran as one native
  # call (38-44 against 106 tok/s in process, 2026-12-02); runs before then set it, so that idle
  # threads would not spin on the load generator's core.
  specserve serve --port "$port" --num-threads "$threads" --max-running-requests 32 "$@" \
    >"$out/server-$port.log" 2>&1 &
  echo $! >"$out/server-$port.pid"
  for _ in $(seq 300); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null && return 0
    sleep 1
  done
  echo "server on $port did not start" >&2; return 1
}
stop_bg() { kill "$(cat "$out/server-$1.pid")" && wait "$(cat "$out/server-$1.pid")" || true; }

if [[ $what == copy || $what == all ]]; then
  # Speculation at batch 1 on copy-heavy requests in the default numerics (q8; issue 22): code
  # edits and the hand-written third-party workload, N = 0 against the adaptive policy (cap 8),
  # each cell from empty caches (the bench resets the prefix cache and the suffix index).
  serve_bg 8317 --speculate 8 --speculation-policy adaptive
  specserve bench --url http://127.0.0.1:8317 --speculate 0,8 --concurrency 1 \
    --workload code-edit --workload workloads/third-party.jsonl --num-requests 8 \
    --max-new-tokens 256 --out "$out/copy-b1"
  stop_bg 8317
fi

if [[ $what == kernels || $what == all ]]; then
  # The q8 kernels (issue 22): every projection at M rows (beside the widest path, the AVX2 one
  # forced where the CPU has AVX512-VNNI), then a verify step's cost against k as the engine
  # runs it, the sides taking turns.
  python -m benchmarks.bench_blocks --threads "$threads" --rows 1,2,3,5,9,16,32,64 --repeats 7 \
    | tee "$out/blocks.md"
  python -m benchmarks.engine_verify --threads "$threads" --sides "q8,q8 AVX2,exact" \
    --rounds 6 --json "$out/verify.json" | tee "$out/verify.md"
  # Weights and KV cache on huge pages against 4 KiB pages, at two context lengths.
  for context in 256 1024; do
    python -m benchmarks.engine_verify --threads "$threads" --sides "q8,q8 4K pages" \
      --ks 0,1,2,4,8 --context "$context" --rounds 30 --json "$out/pages-$context.json" \
      | tee "$out/pages-$context.md"
  done
fi

if [[ $what == goodput || $what == all ]]; then
  # A static N swept per request (adaptive has been the default since 2026-12-05).
  serve_bg 8311 --speculate 8 --speculation-policy static
  specserve bench --url http://127.0.0.1:8311 --speculate 0,2,4,8 --concurrency 1,4,16 \
    --workload code-edit --workload summarize --workload code-complete \
    --workload chat-creative --duration 15 --max-new-tokens 48 --ignore-eos \
    --slo-ttft 3 --slo-itl 0.15 --out "$out/goodput"
  stop_bg 8311
fi

if [[ $what == policy || $what == all ]]; then
  # Static N=5 (N swept per request: 0 and 5) against the adaptive policy, same workload.
  serve_bg 8312 --speculate 5 --speculation-policy static
  specserve bench --url http://127.0.0.1:8312 --speculate 0,5 --concurrency 1,4,16,32 \
    --workload code-edit --duration 15 --max-new-tokens 48 --ignore-eos \
    --slo-ttft 3 --slo-itl 0.15 --out "$out/policy-static"
  stop_bg 8312
  serve_bg 8313 --speculate 5 --speculation-policy adaptive
  specserve bench --url http://127.0.0.1:8313 --speculate 5 --concurrency 1,4,16,32 \
    --workload code-edit --duration 15 --max-new-tokens 48 --ignore-eos \
    --slo-ttft 3 --slo-itl 0.15 --out "$out/policy-adaptive"
  stop_bg 8313
fi

if [[ $what == structured || $what == all ]]; then
  # Speculation under a grammar (issue 23). In process: off / forced text only / n-gram + forced
  # on hand-written documents, compile times, the mask's share of step time at concurrency 16.
  python -m benchmarks.bench_structured --threads "$threads" --repeats 2 \
    --json "$out/structured.json" | tee "$out/structured.md"
  # Over HTTP: N = 0 against 4 at batch 1 on the structured workloads (built-in and hand-written),
  # each cell from empty caches, the adaptive policy (forced text is drafted whatever it decides);
  # every reply is checked against its schema or tools.
  serve_bg 8316 --speculate 4 --speculation-policy adaptive
  specserve bench --url http://127.0.0.1:8316 --speculate 0,4 --concurrency 1 \
    --workload extract-json --workload tool-calls \
    --workload workloads/third-party-structured.jsonl --num-requests 8 --max-new-tokens 512 \
    --out "$out/structured-bench"
  stop_bg 8316
fi

if [[ $what == attention || $what == all ]]; then
  # Step cost against the batch mix, both attention paths in one process.
  python -m benchmarks.bench_attention --threads "$threads" --repeats 7 \
    --json "$out/attention.json" | tee "$out/attention.md"
  # The same 32 requests (code edits, questions over articles, short creative prompts; greedy,
  # 48 new tokens, speculation off) one at a time and 16 at a time, on each attention path.
  python -m specserve.bench.workloads --out "$out/long-mix" --n 11 --seed 0 \
    --workload code-edit --workload summarize --workload chat-creative --mix long-mix
  for impl in reference auto; do
    serve_bg 8314 --speculate 0 --attention "$impl"
    specserve bench --url http://127.0.0.1:8314 --speculate 0 --concurrency 1,16 \
      --workload "$out/long-mix/long-mix.jsonl" --num-requests 32 --max-new-tokens 48 \
      --ignore-eos --slo-ttft 3 --slo-itl 0.15 --out "$out/long-mix/$impl"
    stop_bg 8314
  done
fi

if [[ $what == suffix || $what == all ]]; then
  # Scored drafts, the suffix cache and draft-then-decide (issue 11), all in-process and side by
  # side in one run per command: N=0, static N and adaptive (cap 5) for n-gram and suffix on
  # one engine per proposer, every configuration back to back per (workload, concurrency),
  # each cell from an empty cross-request cache. About 1.2 h (c = 1, 4) + 1 h (c = 16) on 2 threads
  # at the defaults; SUFFIX_SPECULATE / SUFFIX_PROMPTS / SUFFIX_PROMPTS_C16 shrink it.
  sN="${SUFFIX_SPECULATE:-0,2,3,5}"
  reuse="code-edit,summarize,code-complete,chat-creative,code-edit-multiturn,doc-qa"
  reuse="$reuse,workloads/third-party.jsonl"
  python -m benchmarks.spec_bench --threads "$threads" --proposer ngram,suffix \
    --policy static,adaptive --speculate "$sN" --concurrency 1,4 --workloads "$reuse" \
    --prompts-per-workload "${SUFFIX_PROMPTS:-12}" --new-tokens 128 --json "$out/suffix-c1-4.json" \
    | tee "$out/suffix-c1-4.md"
  # Concurrency 16 needs more requests than slots to reach a steady batch.
  python -m benchmarks.spec_bench --threads "$threads" --proposer ngram,suffix \
    --policy static,adaptive --speculate "$sN" --concurrency 16 --workloads "$reuse" \
    --prompts-per-workload "${SUFFIX_PROMPTS_C16:-32}" --new-tokens 128 --json "$out/suffix-c16.json" \
    | tee "$out/suffix-c16.md"
  # Medusa with scored drafts at batch 1: static N against adaptive (cap 4), same engine.
  python -m benchmarks.spec_bench --threads "$threads" --proposer medusa \
    --policy static,adaptive --speculate 0,1,2,3,4 --concurrency 1 \
    --workloads chat-creative,code-edit --prompts-per-workload 6 --new-tokens 128 \
    --json "$out/medusa-scored.json" | tee "$out/medusa-scored.md"
  # Lookup and ingestion cost of the suffix index at 2k/8k/32k cached tokens; memory at the bound.
  python -m benchmarks.bench_suffix --calls 2000 | tee "$out/suffix-index.md"
fi

if [[ $what == eagle || $what == all ]]; then
  # Free-text drafting (issue 25), in process, each cell from empty caches, adaptive with cap 4
  # against N = 0 on the same engine. First what a drafted token costs against a target step.
  python -m benchmarks.bench_eagle --threads "$threads" --json "$out/eagle-cost.json" \
    | tee "$out/eagle-cost.md"
  # Whether a draft tree would pay: the head's top 2 at depth 1 against the emitted token, with
  # the verify cost of 1-6 rows (about 1 min).
  python -m benchmarks.eagle_top2 --threads "$threads" --json "$out/eagle-top2.json" \
    | tee "$out/eagle-top2.md"
  # Batch 1: Medusa, the EAGLE head and the hybrid on
  # chat-creative and the hand-written free-form file (about 1 min on 2026-12-03).
  python -m benchmarks.spec_bench --threads "$threads" --proposer medusa,eagle,hybrid \
    --policy adaptive --speculate 0,4 --concurrency 1 \
    --workloads chat-creative,workloads/third-party-free.jsonl --prompts-per-workload 8 \
    --new-tokens 128 --json "$out/eagle-free.json" | tee "$out/eagle-free.md"
  # The hybrid against each single proposer on the built-in workloads at batch 1, each cell
  # three times (about 18 min), then the hybrid alone against N = 0 at 16 at once (16 requests a
  # workload: one full batch), each cell three times (about 10 min); the median repeat counts,
  # and each repeat against the N = 0 (or other proposer) cell run beside it.
  builtin="code-edit,summarize,code-complete,chat-creative,code-edit-multiturn,doc-qa"
  python -m benchmarks.spec_bench --threads "$threads" --proposer ngram,suffix,eagle,hybrid \
    --policy adaptive --speculate 0,4 --concurrency 1 --workloads "$builtin" \
    --prompts-per-workload "${EAGLE_PROMPTS:-6}" --new-tokens 128 --repeats 3 \
    --json "$out/hybrid-c1.json" | tee "$out/hybrid-c1.md"
  python -m benchmarks.spec_bench --threads "$threads" --proposer hybrid \
    --policy adaptive --speculate 0,4 --concurrency 16 --workloads "$builtin" \
    --prompts-per-workload "${EAGLE_PROMPTS_C16:-16}" --new-tokens 128 --repeats 3 \
    --json "$out/hybrid-c16.json" | tee "$out/hybrid-c16.md"
  # The same with 48 requests a workload through the 16 slots (a finished request's slot takes
  # the next), as a server at 16 concurrent clients sees it (about 30 min): in one full batch
  # the cell lasts as many steps as its slowest request, whatever the others accepted.
  python -m benchmarks.spec_bench --threads "$threads" --proposer hybrid \
    --policy adaptive --speculate 0,4 --concurrency 16 --workloads "$builtin" \
    --prompts-per-workload 48 --new-tokens 128 --repeats 3 \
    --json "$out/hybrid-c16x48.json" | tee "$out/hybrid-c16x48.md"
  # Where the hybrid's steps spend their time at 16 at once against N = 0, 48 requests through
  # the 16 slots, five rounds (about 35 min).
  python -m benchmarks.spec_ledger --threads "$threads" \
    --workloads code-edit,summarize,code-complete,chat-creative,code-edit-multiturn,doc-qa \
    --requests 48 --rounds 5 --json "$out/ledger-c16-all.json" | tee "$out/ledger-c16-all.md"
  # The same on the marginal workloads with the requests' lengths spread over 64-192 new tokens
  # (the same on both sides), so that N = 0 does not run in lockstep (about 10 min).
  python -m benchmarks.spec_ledger --threads "$threads" \
    --workloads summarize,chat-creative,code-complete --requests 48 --lengths 64-192 \
    --rounds 5 --json "$out/ledger-c16-lengths.json" | tee "$out/ledger-c16-lengths.md"
  # The payoff (proposing's own time weighed) against the same policy with a payoff that never
  # closes, at 16 at once and at batch 1, with the hand-written free text (about 12 min).
  python -m benchmarks.spec_ledger --threads "$threads" \
    --workloads chat-creative,summarize,code-complete,workloads/third-party-free.jsonl \
    --requests 48 --rounds 3 --compare-payoff --json "$out/payoff-c16.json" \
    | tee "$out/payoff-c16.md"
  python -m benchmarks.spec_ledger --threads "$threads" --concurrency 1 \
    --workloads chat-creative,code-edit,workloads/third-party-free.jsonl --requests 6 \
    --rounds 2 --compare-payoff --json "$out/payoff-c1.json" | tee "$out/payoff-c1.md"
fi

if [[ $what == cache || $what == all ]]; then
  # Prefix caching on against off: conversations (each turn resends the last), questions over
  # shared documents, and creative prompts with nothing to reuse; speculation off, so only the
  # cache differs. specserve bench empties the cache before every cell.
  for side in off on; do
    flag=""; [[ $side == off ]] && flag="--no-prefix-caching"
    serve_bg 8315 --speculate 0 $flag
    specserve bench --url http://127.0.0.1:8315 --speculate 0 --concurrency 1,4,16 \
      --workload code-edit-multiturn --workload doc-qa --workload chat-creative \
      --duration 30 --max-new-tokens 48 --ignore-eos --slo-ttft 3 --slo-itl 0.15 \
      --out "$out/cache-$side"
    stop_bg 8315
  done
  python -m benchmarks.cache_report --on "$out/cache-on" --off "$out/cache-off" \
    | tee "$out/cache.md"
  # The cache's cost where nothing is reused (chat-creative above still shares the chat
  # template's first block and repeats prompts within a cell): unique random prompts, one engine
  # per side in one process.
  python -m benchmarks.bench_prefix_cost --threads "$threads" \
    --json "$out/prefix-cost.json" | tee "$out/prefix-cost.md"
fi

if [[ $what == kv || $what == all ]]; then
  # Issue 13's reproductions (a runs --num-threads 1 as reported, b THREADS) beside ample KV.
  python -m benchmarks.bench_kv_pressure --threads "$threads" --json "$out/kv-pressure.json" \
    | tee "$out/kv-pressure.md"
fi

if [[ $what == soak || $what == all ]]; then
  SPECSERVE_SOAK_REQUESTS="${SOAK_REQUESTS:-10000}" SPECSERVE_SOAK_OUT="$out/soak.json" \
    python -m pytest -m slow tests/server/test_soak.py -s -q | tee "$out/soak.txt"
  # The same soak with ~3 % abuse mixed in (long stops, -inf logprobs, 2 MB prompts, /tokenize
  # floods, nested JSON): compare its ordinary streams' ITL with the run above.
  SPECSERVE_SOAK_ABUSE=1 SPECSERVE_SOAK_REQUESTS="${SOAK_REQUESTS:-10000}" \
    SPECSERVE_SOAK_OUT="$out/soak-abuse.json" \
    python -m pytest -m slow tests/server/test_soak.py -s -q | tee "$out/soak-abuse.txt"
fi

if [[ $what == fleet || $what == all ]]; then
  # Mixed traffic: one serve with one global setting against a fleet planned from a profile.
  # PROFILE=path reuses a speculation profile; else a short sweep measures one here.
  fdir="$out/fleet"
  mkdir -p "$fdir"
  profile="${PROFILE:-}"
  if [[ -z $profile ]]; then
    serve_bg 8314 --speculate 8 --speculation-policy static
    specserve bench --url http://127.0.0.1:8314 --speculate 0,2,4,8 --concurrency 1,4 \
      --workload code-edit --workload chat-creative --workload summarize \
      --duration "${FLEET_BENCH_S:-15}" --max-new-tokens 48 --ignore-eos \
      --slo-ttft 3 --slo-itl 0.15 --out "$fdir/profile"
    stop_bg 8314
    profile="$fdir/profile/speculation-profile.json"
  fi
  # Each pool: one torch thread, half a CPU of the 2-CPU Ray cluster (up to 4 pools).
  specserve fleet plan --profile "$profile" --out "$fdir/fleet.yaml" --num-threads 1 --num-cpus 0.5
  python -m benchmarks.bench_fleet --fleet-config "$fdir/fleet.yaml" --num-cpus 2 \
    --serve-args "--speculate 4 --speculation-policy static --num-threads $threads --max-running-requests 32" \
    --duration "${FLEET_DURATION:-60}" --slo-ttft 3 --slo-itl 0.15 --out "$fdir"
fi
