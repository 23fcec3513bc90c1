"""Medusa training data: the base's own greedy continuations, with its hidden states, turned
into (hidden state, future tokens) pairs over the draft vocabulary (see medusa_train.py)."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.progress import Progress

from specserve.bench.workload_items import WorkloadItem, encode_item
from specserve.bench.workloads import build_workload
from specserve.config import CacheConfig, EngineConfig, SchedulerConfig, SpecConfig
from specserve.engine.engine import Engine
from specserve.engine.resources import load_resources
from specserve.models.block_linear import linear_weight
from specserve.request import SamplingParams, Sequence
from specserve.speculation.proposer import Draft, Proposer
from specserve.training.medusa_options import TrainOptions

IGNORE = -100  # target past the end of a continuation


@dataclass(frozen=True)
class Continuation:
    workload: str
    heldout: bool
    tokens: list[int]  # the base's greedy output x_0 .. x_{L-1}
    hidden: torch.Tensor  # [L - 1, hidden]: row p chose tokens[p]


@dataclass(frozen=True)
class HeadData:
    hidden: torch.Tensor  # [N, hidden]
    targets: torch.Tensor  # [N, heads] int64 index into the draft vocab; IGNORE: none there
    valid: torch.Tensor  # [N, heads] bool: the continuation has that token
    workloads: list[str]  # [N]


# ---------------------------------------------------------------------------------- collect
class _HiddenRecorder(Proposer):
    """A Proposer that proposes nothing and keeps every hidden state `sync` hands it."""

    name = "record"

    def __init__(self) -> None:
        self.rows: dict[str, dict[int, torch.Tensor]] = defaultdict(dict)  # request -> p -> h_p

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[Draft]:
        return [Draft(tokens=[]) for _ in seqs]

    def sync(self, seq: Sequence, hidden: torch.Tensor) -> None:
        self.rows[seq.request_id][len(seq.output_ids) - 1] = hidden.clone()

    def release(self, seq: Sequence) -> None:
        del seq  # the rows are the data; a preempted sequence re-syncs the same positions


def recording_engine(
    base_dir: Path, opts: TrainOptions, eos_ids: frozenset[int] | None = None
) -> Engine:
    """`eos_ids`: the tokens that end a continuation, if not the model's."""
    # speculate=1 makes the engine sync its proposer after every step; the recorder then
    # replaces the proposer and never drafts.
    config = EngineConfig(
        model=str(base_dir),
        max_model_len=opts.max_prompt_tokens + opts.new_tokens + 1,
        cache=CacheConfig(block_size=16),
        scheduler=SchedulerConfig(max_batch_tokens=2048, max_running_requests=opts.concurrency),
        spec=SpecConfig(speculate=1, proposer="ngram"),
    )
    res = load_resources(config)
    return Engine(
        config, dataclasses.replace(res, proposer=_HiddenRecorder(), policy=None), eos_ids
    )


def training_prompts(engine: Engine, opts: TrainOptions) -> list[tuple[WorkloadItem, list[int]]]:
    # A workload named twice in `opts.workloads` gets twice the prompts.
    limit = min(opts.max_prompt_tokens, engine.max_model_len - opts.new_tokens)
    out = []
    for name, weight in Counter(opts.workloads).items():
        want = math.ceil(opts.prompts * weight / len(opts.workloads))
        bench = {_key(item) for item in build_workload(name, 32, 0)}
        items = [i for i in build_workload(name, want * 2, opts.seed) if _key(i) not in bench]
        unique = {_key(i): i for i in items}.values()
        encoded = ((item, encode_item(engine, item)) for item in unique)
        out += list(itertools.islice(((i, p) for i, p in encoded if len(p) <= limit), want))
    return out


def _key(item: WorkloadItem) -> str:
    return item.prompt or repr(item.messages)


def collect(
    engine: Engine,
    prompts: list[tuple[WorkloadItem, list[int]]],
    opts: TrainOptions,
    progress: bool = True,
) -> list[Continuation]:
    """The base's greedy continuation of every prompt, with its hidden states."""
    recorder = engine.proposer
    assert isinstance(recorder, _HiddenRecorder)
    params = SamplingParams(max_new_tokens=opts.new_tokens)
    ids = [engine.add_request(p, params) for _, p in prompts]
    tokens: dict[str, list[int]] = defaultdict(list)
    with Progress(disable=not progress) as bar:
        task = bar.add_task("greedy continuations", total=len(ids))
        while engine.has_work():
            for out in engine.step():
                tokens[out.request_id] += out.new_token_ids
                bar.advance(task, int(out.finished))
    seen: dict[str, int] = defaultdict(int)
    conts = []
    for rid, (item, _) in zip(ids, prompts, strict=True):
        # a request whose first token was EOS recorded no hidden state
        toks, rows = tokens[rid], recorder.rows.pop(rid, {})
        seen[item.workload] += 1
        if len(toks) >= 2:
            hidden = torch.stack([rows[p] for p in range(len(toks) - 1)])
            heldout = seen[item.workload] % opts.heldout_every == 0
            conts.append(Continuation(item.workload, heldout, toks, hidden))
    return conts


def split_heldout(
    conts: list[Continuation], opts: TrainOptions
) -> tuple[list[Continuation], list[Continuation]]:
    """(training, held-out) continuations; a clear error when either is empty."""
    train = [c for c in conts if not c.heldout]
    held = [c for c in conts if c.heldout]
    if not train or not held:
        raise ValueError(
            f"{len(conts)} usable continuations leave no train or no held-out split (every "
            f"{opts.heldout_every}th prompt of a workload is held out): raise --prompts"
        )
    return train, held


def draft_vocab(conts: list[Continuation]) -> torch.Tensor:
    """[K] sorted int64: every token the base emitted in `conts`."""
    return torch.unique(torch.cat([torch.tensor(c.tokens) for c in conts]))


def vocab_head(lm_head: torch.nn.Module, vocab: torch.Tensor) -> torch.nn.Linear:
    """The frozen lm_head restricted to the rows of `vocab` [K]."""
    weight = linear_weight(lm_head).detach()
    head = torch.nn.Linear(weight.shape[1], len(vocab), bias=False)
    head.weight = torch.nn.Parameter(weight[vocab].float(), requires_grad=False)
    return head


def head_data(conts: list[Continuation], heads: int, vocab: torch.Tensor) -> HeadData:
    """Row p of a continuation targets tokens[p + 1 + i] for head i."""
    hidden, targets, workloads = [], [], []
    for c in conts:
        ext = torch.tensor(c.tokens[1:] + [IGNORE] * heads)
        n = len(c.tokens) - 1
        hidden.append(c.hidden)
        targets.append(torch.stack([ext[i : i + n] for i in range(heads)], dim=1))
        workloads += [c.workload] * n
    ids = torch.cat(targets)
    pos = torch.searchsorted(vocab, ids.clamp(min=0)).clamp(max=len(vocab) - 1)
    inside = (ids >= 0) & (vocab[pos] == ids)
    return HeadData(
        torch.cat(hidden).float(),
        torch.where(inside, pos, IGNORE),
        ids != IGNORE,
        workloads,
    )
