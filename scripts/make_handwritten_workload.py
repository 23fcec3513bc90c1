"""Assemble workloads/third-party.jsonl: hand-written requests over text no built-in workload
uses (third-party package sources and READMEs from the venv, and creative prompts written for
this file), and workloads/third-party-structured.jsonl (documents into JSON schemas and tool
calls, all written for this project). The instructions and questions below are written by
hand; the quoted texts are copied verbatim from the installed packages named in
workloads/README.md (all MIT or BSD licensed, which permit quoting with their notices; see that
file).

Usage (repo root): .venv/bin/python scripts/make_handwritten_workload.py [--out PATH]

The committed JSONL is what benchmarks use; this script records how it was made and rebuilds it
from the same package versions.
"""

from __future__ import annotations

import argparse
import email
import importlib.metadata as md
import json
import site
import sys
from pathlib import Path

from specserve.bench.structured_workloads import tool
from specserve.bench.workload_items import ChatMessage, WorkloadItem, write_workload

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: benchmarks/
WORKLOAD = "third-party"
STRUCTURED_WORKLOAD = "third-party-structured"
FILE_ASK = "Make no other changes. Output the full updated file in a single ```python code block."

# (package, path in site-packages, instruction, follow-up instruction or None)
EDITS = (
    ("idna", "idna/intranges.py",
     "Rename the function `intranges_contain` to `ranges_contain` and update every reference.",
     "Now also add a one-line docstring to `_encode_range` saying what it packs."),
    ("idna", "idna/intranges.py",
     "Replace the `for i in range(len(sorted_list))` loop by one over `enumerate(sorted_list)`.",
     None),
    ("rich", "rich/_loop.py",
     "Rename `loop_first_last` to `iter_first_last`.",
     "Now also change the docstring of `loop_last` to say it flags the final value."),
    ("sniffio", "sniffio/_impl.py",
     "Rename the class `_ThreadLocal` to `_LibraryName` and update every reference.",
     None),
    ("mdurl", "mdurl/_encode.py",
     "Rename `get_encode_cache` to `encode_table` and update every reference.",
     "Now also change `ENCODE_COMPONENT_CHARS` so that it no longer includes the apostrophe."),
    ("mdurl", "mdurl/_decode.py",
     "Add a one-line docstring to every function that has none.",
     None),
)  # fmt: skip

# (package, question) over the package's README (its METADATA description)
README_QUESTIONS = (
    ("httpx", "List the features this README says the client has, one per line."),
    ("httpx", "Quote the command the README gives for installing the package."),
    ("h11", "In two sentences, what does this library do and what does it leave out?"),
    ("h11", "Quote the sentence that says what the library does not do."),
    ("sniffio", "What problem does this package solve? Answer in one short paragraph."),
    ("idna", "Give the example from the README that encodes a domain name, as code."),
    ("click", "Summarise the README in three bullet points."),
    ("iniconfig", "What does iniconfig promise about the files it parses? Quote it."),
)

CREATIVE = (
    "Write a recipe, in the style of an instruction manual, for repairing a broken friendship.",
    "Describe a thunderstorm from the point of view of a very old oak tree.",
    "Write the opening paragraph of a detective story set on a ferry in winter.",
    "Invent three proverbs for a town where everyone keeps bees, and explain each in a line.",
    "Write a short letter from a lighthouse to the ships it has guided, thanking them.",
    "Tell a bedtime story, under 150 words, about a snail that wants to see the sea.",
)


def site_file(relpath: str) -> str:
    for root in site.getsitepackages():
        path = Path(root) / relpath
        if path.is_file():
            return path.read_text(encoding="utf-8")
    raise FileNotFoundError(relpath)


def readme(package: str) -> str:
    meta = email.message_from_string(md.distribution(package).read_text("METADATA") or "")
    body = str(meta.get_payload())
    return body[:3500]


# Free-form requests for the free-text drafters (EAGLE, Medusa): the creative prompts above and
# these, written for workloads/third-party-free.jsonl; nothing to copy from a context.
FREE_FORM = (
    "Explain to a ten-year-old why the sky turns orange at sunset.",
    "Give three tips for keeping a sourdough starter alive while travelling, a sentence on each.",
    "What are the trade-offs between renting and buying a bicycle in a large city? One paragraph.",
    "Describe the smell of a bakery at five in the morning.",
    "Write three haiku about a train station at night.",
    "Explain what a compiler does, in plain words, for someone who has never programmed.",
    "Suggest a plan for two rainy days in a small coastal town.",
    "Write a dialogue between a teapot and a kettle arguing about which of them matters more.",
    "List the pros and cons of working from home in five bullet points.",
    "Write a product description for a pair of socks that can never get lost.",
)
FREE_WORKLOAD = "third-party-free"


def build_free() -> list[WorkloadItem]:
    prompts = CREATIVE + FREE_FORM
    return [
        WorkloadItem(f"tp-free-{i}", FREE_WORKLOAD, messages=(ChatMessage("user", prompt),))
        for i, prompt in enumerate(prompts)
    ]


def build() -> list[WorkloadItem]:
    items: list[WorkloadItem] = []
    for i, (package, relpath, ask, then) in enumerate(EDITS):
        source = site_file(relpath)
        first = WorkloadItem(
            f"tp-edit-{i}.0:{relpath}@{md.version(package)}",
            WORKLOAD,
            messages=(
                ChatMessage(
                    "user", f"Here is `{relpath}`:\n\n```python\n{source}```\n\n{ask} {FILE_ASK}"
                ),
            ),
        )
        items.append(first)
        if then is not None:
            follow = WorkloadItem(
                f"tp-edit-{i}.1:{relpath}",
                WORKLOAD,
                messages=(ChatMessage("user", f"{then} {FILE_ASK}"),),
                follows=first.id,
            )
            items.append(follow)
    for i, (package, question) in enumerate(README_QUESTIONS):
        intro = f"Here is the README of the Python package `{package}`:"
        text = f"{intro}\n\n{readme(package)}\n\n{question}"
        items.append(
            WorkloadItem(
                f"tp-readme-{i}:{package}@{md.version(package)}",
                WORKLOAD,
                messages=(ChatMessage("user", text),),
            )
        )
    for i, prompt in enumerate(CREATIVE):
        items.append(
            WorkloadItem(f"tp-creative-{i}", WORKLOAD, messages=(ChatMessage("user", prompt),))
        )
    return items


_SHORT = {"type": "string", "maxLength": 50}
TOOLS = [  # open (other keys allowed), as many users write them
    tool(
        "set_reminder",
        "Remind the user of something at a time.",
        {"text": _SHORT, "when": _SHORT},
        closed=False,
    ),
    tool(
        "find_train",
        "Trains between two stations on a date.",
        {"from_station": _SHORT, "to_station": _SHORT, "date": _SHORT},
        closed=False,
    ),
    tool(
        "log_expense",
        "Record a spending in the household budget.",
        {"amount": {"type": "number"}, "category": {"enum": ["food", "travel", "home", "other"]}},
        closed=False,
    ),
]
# (request, tool_choice)
TOOL_ASKS = (
    ("Remind me to water the tomatoes at seven tomorrow evening.", "required"),
    ("Which trains go from Leeds to York on the 3rd of April?", "required"),
    ("I just paid 14.60 for a bag of lemons and some bread, please note it down.", "auto"),
    ("Can you put 'call the plumber about the boiler' on my list for Monday morning?", "auto"),
    ("Log 92 pounds for the new curtains in the living room.", "required"),
)


def build_structured() -> list[WorkloadItem]:
    """The structured workload: bench_structured's documents into their schemas, then requests
    for the tools above (both written for this file)."""
    from benchmarks.structured_docs import DOCS

    items = []
    for i, (doc, schema) in enumerate(DOCS):
        fmt = {"type": "json_schema", "json_schema": {"name": "fields", "schema": schema}}
        ask = ChatMessage("system", "Extract the fields of the document as JSON.")
        items.append(
            WorkloadItem(
                f"tps-extract-{i}",
                STRUCTURED_WORKLOAD,
                messages=(ask, ChatMessage("user", doc)),
                structured=json.dumps({"response_format": fmt}, sort_keys=True),
            )
        )
    for i, (ask, choice) in enumerate(TOOL_ASKS):
        fields = {"tools": TOOLS, "tool_choice": choice}
        items.append(
            WorkloadItem(
                f"tps-tool-{i}",
                STRUCTURED_WORKLOAD,
                messages=(ChatMessage("user", ask),),
                structured=json.dumps(fields, sort_keys=True),
            )
        )
    return items


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("workloads/third-party.jsonl"))
    p.add_argument(
        "--structured-out", type=Path, default=Path("workloads/third-party-structured.jsonl")
    )
    p.add_argument("--free-out", type=Path, default=Path("workloads/third-party-free.jsonl"))
    args = p.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_workload(args.out, build())
    write_workload(args.structured_out, build_structured())
    write_workload(args.free_out, build_free())
    print(args.out, args.structured_out, args.free_out)


if __name__ == "__main__":
    main()
