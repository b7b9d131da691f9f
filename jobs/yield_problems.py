"""Problems of mixed difficulty for the yield benchmark (`semjobs bench --yield --problems
mixed:COUNT`): arithmetic problems generated here, graded from a one-digit sum asked bare to
two steps told as a story, each with its answer computed, mixed with GSM8K test questions from line 301 on
(lines 1-100 are the other benchmarks' prompts; SmolLM2-135M rarely solves GSM8K, so alone it
would keep next to nothing and every way of sampling would look alike).

Deterministic: the same COUNT gives the same problems, in the same order, on every machine.
Each line says where it came from (``source``: ``generated:LEVEL``, ``gsm8k-test:LINE``, or
``prompts:LINE`` for a line of the bench's ``--prompts`` file).
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from typing import Callable

from semspec.answers import reference_from

NAMES = ("Anna", "Ben", "Carla", "David", "Emma", "Farid", "Grace", "Hugo", "Ines", "Jamal", "Kate", "Liam")
THINGS = ("apples", "pencils", "marbles", "stickers", "books", "cookies", "stamps", "shells")
GSM8K_FIRST_LINE = 301  # 1-based: lines 1-100 are the shipped bench's and calibration's prompts
# The doom rule's calibration problems (`semjobs doom calibrate --problems mixed:COUNT`): other
# generated ones (another seed, none twice and none with the text of one of `--problems
# mixed:BENCHMARK_COUNT`'s) and GSM8K lines before the yield benchmark's, so the benchmark
# measures the rule on problems it never saw. The easiest levels have few distinct questions
# (add_tiny 16, mul_bare 64): they give the calibration what the benchmark leaves.
CALIBRATION_SEED = 1
CALIBRATION_GSM8K_LINE = 101
BENCHMARK_COUNT = 64


# Plain questions asked for a bare number: SmolLM2-135M answers them far more often than the
# same sums told at length (a one-step "X has A things. X gets B more." 0.11 of samples right).
ONLY = " Answer with just the number."


def add_tiny(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(1, 4), rng.randint(1, 4)
    return f"What is {a} + {b}?{ONLY}", a + b


def mul_bare(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    return f"What is {a} times {b}?{ONLY}", a * b


def add_story(rng: random.Random) -> tuple[str, int]:
    name, thing, a, b = rng.choice(NAMES), rng.choice(THINGS), rng.randint(2, 9), rng.randint(2, 9)
    return f"{name} has {a} {thing} and gets {b} more. How many {thing} does {name} have?{ONLY}", a + b


def mul_story(rng: random.Random) -> tuple[str, int]:
    thing, a, b = rng.choice(THINGS), rng.randint(2, 9), rng.randint(2, 9)
    return f"There are {a} boxes with {b} {thing} in each box. How many {thing} are there?{ONLY}", a * b


def add_big(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    return f"What is {a} + {b}?{ONLY}", a + b


def sub_story(rng: random.Random) -> tuple[str, int]:
    name, thing, a, b = rng.choice(NAMES), rng.choice(THINGS), rng.randint(2, 9), rng.randint(2, 9)
    return f"{name} has {a + b} {thing} and gives away {b}. How many {thing} does {name} have left?{ONLY}", a


def two_step(rng: random.Random) -> tuple[str, int]:
    name, thing, a, b = rng.choice(NAMES), rng.choice(THINGS), rng.randint(5, 15), rng.randint(2, 9)
    c = rng.randint(2, a + b - 2)
    return (f"{name} has {a} {thing}, gets {b} more and gives away {c}. How many {thing} does {name} have "
            f"now?{ONLY}", a + b - c)


# Easiest first. SmolLM2-135M's share of right samples (T 0.6, top-p 0.95, 256 tokens; 8 problems
# of each at seed 1, 8 samples each, 2026-12-07), plain vLLM / `semjobs run`: add_tiny 0.58 / 0.58,
# mul_bare 0.62 / 0.66, add_story 0.33 / 0.33, mul_story 0.27 / 0.31, add_big 0.08 / 0.06,
# sub_story 0.06 / 0.09, two_step 0.03 / 0.05; GSM8K test lines 501-508 0.02 / 0.02.
LEVELS: dict[str, Callable[[random.Random], tuple[str, int]]] = {
    "add_tiny": add_tiny, "mul_bare": mul_bare, "add_story": add_story, "mul_story": mul_story,
    "add_big": add_big, "sub_story": sub_story, "two_step": two_step,
}
# Weighted to the easy levels, so that most problems keep something and GSM8K's and the
# multi-step ones' near-zero rates make the hard end, not the median: mixed:64, 8 samples each
# as above, had rates from 0 to 1, median 0.375, 39 problems at 0.2 or more and 17 at 0.
MIX = {"add_tiny": 3, "mul_bare": 3, "add_story": 3, "mul_story": 2, "add_big": 1, "sub_story": 1, "two_step": 1,
       "gsm8k": 2}


def generated(level: str, count: int, seed: int = 0) -> list[dict]:
    """``count`` problems of ``level``, the same for the same (level, seed)."""
    rng = random.Random(f"{level}:{seed}")  # a string seed: stable across Python versions
    out = []
    for i in range(count):
        question, answer = LEVELS[level](rng)
        out.append({"id": f"{level}-{i}", "prompt": question, "answer": str(answer), "source": f"generated:{level}"})
    return out


def gsm8k(path: str | Path, count: int, first_line: int = GSM8K_FIRST_LINE) -> list[dict]:
    """``count`` GSM8K test questions from 1-based line ``first_line`` on, their reference the
    number after ``####``."""
    out = []
    with open(path) as f:
        for number, line in enumerate(f, start=1):
            if number < first_line or not line.strip():
                continue
            if len(out) == count:
                break
            rec = json.loads(line)
            out.append({"id": f"gsm8k-{number}", "prompt": rec["question"], "answer": reference_from(rec["answer"]),
                        "source": f"gsm8k-test:{number}"})
    if len(out) < count:
        raise ValueError(f"{path} has {len(out)} questions from line {first_line} on, not {count}")
    return out


def shares(count: int, mix: dict[str, int] = MIX) -> dict[str, int]:
    """``count`` split by the weights of ``mix``, the remainder to the first parts."""
    total = sum(mix.values())
    out = {part: count * w // total for part, w in mix.items()}
    for part in list(mix)[:count - sum(out.values())]:
        out[part] += 1
    return out


def mixed(count: int, gsm8k_path: str | Path, seed: int = 0, gsm8k_first_line: int = GSM8K_FIRST_LINE) -> list[dict]:
    """``count`` problems in ``MIX``'s shares, shuffled (so that each engine process's
    contiguous share of a job holds every level)."""
    problems: list[dict] = []
    for part, k in shares(count).items():
        problems += gsm8k(gsm8k_path, k, gsm8k_first_line) if part == "gsm8k" else generated(part, k, seed)
    random.Random(f"mixed:{seed}").shuffle(problems)
    return problems


def calibration_mixed(count: int, gsm8k_path: str | Path) -> list[dict]:
    """At most ``count`` of ``mixed``'s problems for the doom rule's calibration
    (``CALIBRATION_SEED``, GSM8K from ``CALIBRATION_GSM8K_LINE``): none of the yield
    benchmark's, none twice; fewer where a level has no more."""
    wanted = shares(count)
    last = CALIBRATION_GSM8K_LINE + wanted["gsm8k"] - 1
    if last >= GSM8K_FIRST_LINE:
        raise ValueError(f"mixed:{count} would calibrate on GSM8K line {last}, one of the yield benchmark's "
                         f"(from {GSM8K_FIRST_LINE}); take fewer")
    seen = {p["prompt"] for p in mixed(BENCHMARK_COUNT, gsm8k_path)}
    problems = gsm8k(gsm8k_path, wanted.pop("gsm8k"), CALIBRATION_GSM8K_LINE)
    for level, k in wanted.items():
        fresh = []
        for p in generated(level, 50 * k, CALIBRATION_SEED):
            if len(fresh) < k and p["prompt"] not in seen:
                seen.add(p["prompt"])
                fresh.append(p)
        problems += fresh
    random.Random(f"mixed:{CALIBRATION_SEED}").shuffle(problems)
    return problems


def from_prompts(prompts: list[dict]) -> list[dict]:
    """The bench's own prompts (``--prompts``, ``--limit``, ``--offset``, as
    ``semspec.benchmark.runner.load_prompts`` reads GSM8K lines or semjobs input lines) as
    problems. (Read by the command: a module of the service imports nothing of the bench.)"""
    out = []
    for p in prompts:
        text = {"messages": p["prompt"]} if isinstance(p["prompt"], list) else {"prompt": p["prompt"]}
        answer = {"answer": p["reference"]} if p["reference"] is not None else {}
        out.append({"id": p["id"], **text, **answer, "source": f"prompts:{p['line'] + 1}"})
    return out


def kinds(problems: list[dict]) -> dict[str, int]:
    """How many problems came from where: each generated level, GSM8K, the prompts file."""
    return dict(Counter(p["source"] if p["source"].startswith("generated:") else p["source"].split(":")[0]
                        for p in problems))


def write(problems: list[dict], path: str | Path) -> Path:
    """Problems as a `semjobs run` input file: one {id, prompt, answer, source} line each."""
    path = Path(path)
    path.write_text("".join(json.dumps(p) + "\n" for p in problems))
    return path
