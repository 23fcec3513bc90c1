"""`specserve` command line: generate, serve, bench, diagnose, fleet."""

from __future__ import annotations

import argparse
import logging
import sys

from specserve import __version__
from specserve.bench.cli import add_bench_parsers
from specserve.cli_args import add_engine_args, engine_config_from_args
from specserve.cli_flags import add_flag
from specserve.fleet.cli import add_fleet_parser
from specserve.server.cli import add_serve_parser
from specserve.training.eagle_cli import add_eagle_parser
from specserve.training.medusa_cli import add_medusa_parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specserve",
        description="LLM inference with lossless, load-aware speculative decoding.",
    )
    parser.add_argument("--version", action="version", version=f"specserve {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser(
        "generate",
        help="stream one completion to stdout",
        description="Stream one completion to stdout. Every flag can also be set through the "
        "environment variable named in its help.",
    )
    gen.add_argument("prompt", help="the prompt text")
    add_engine_args(gen)
    add_sampling_args(gen)
    gen.add_argument(
        "--raw", action="store_true", help="send the prompt as is, without the chat template"
    )
    gen.add_argument(
        "--stats",
        action="store_true",
        help="print tokens/s and speculation counts to stderr at the end",
    )
    gen.set_defaults(func=cmd_generate)
    add_serve_parser(sub)
    add_medusa_parser(sub)
    add_eagle_parser(sub)
    add_bench_parsers(sub)
    add_fleet_parser(sub)
    return parser


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    """`generate`'s sampling flags (SPECSERVE_-prefixed environment forms: names like SEED
    or TEMPERATURE are too likely to be set for something else)."""
    add_flag(p, "--max-new-tokens", "SPECSERVE_MAX_NEW_TOKENS", 128, "tokens to generate", int)
    add_flag(p, "--temperature", "SPECSERVE_TEMPERATURE", 0.0, "0 = greedy", float)
    add_flag(p, "--top-p", "SPECSERVE_TOP_P", 1.0, "nucleus sampling mass", float)
    add_flag(p, "--top-k", "SPECSERVE_TOP_K", 0, "keep the k most likely tokens; 0 = off", int)
    add_flag(p, "--seed", "SPECSERVE_SEED", None, "sampling seed (unset = random)", int)


def cmd_generate(args: argparse.Namespace) -> int:
    import time

    from specserve.engine.engine import Engine
    from specserve.request import SamplingParams

    config = engine_config_from_args(args)
    try:
        engine = Engine(config)
        params = SamplingParams(
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            seed=args.seed,
        )
        prompt = (
            args.prompt
            if args.raw
            else engine.encode_chat([{"role": "user", "content": args.prompt}])
        )
        engine.add_request(prompt, params)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    started, n = time.perf_counter(), 0
    while engine.has_work():
        for out in engine.step():
            sys.stdout.write(out.new_text)
            sys.stdout.flush()
            n += len(out.new_token_ids)
            if out.finished:
                sys.stdout.write("\n")
                if args.stats:
                    secs = time.perf_counter() - started
                    print(
                        f"[{n} tokens in {secs:.2f} s, {n / secs:.1f} tok/s, "
                        f"finish={out.finish_reason}, drafted={out.drafted_tokens}, "
                        f"accepted={out.accepted_tokens}]",
                        file=sys.stderr,
                    )
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
