"""The yield benchmark's problems: deterministic, each reference the question's own answer,
GSM8K lines only from 301 on, a file `semjobs run` reads with those references."""

from __future__ import annotations

import json
import re

import pytest

from semjobs.jobs import yield_problems as yp
from semjobs.jobs.schema import iter_records
from semspec.answers import reference_from
from semspec.assets import GSM8K_TEST

# Each level's question read back independently of the generator: its numbers, in order, and
# what they make.
READ_BACK = {
    "add_tiny": (r"What is (\d+) \+ (\d+)\?", lambda a, b: a + b),
    "mul_bare": (r"What is (\d+) times (\d+)\?", lambda a, b: a * b),
    "add_story": (r"has (\d+) \w+ and gets (\d+) more\. How many", lambda a, b: a + b),
    "mul_story": (r"There are (\d+) boxes with (\d+) \w+ in each box\.", lambda a, b: a * b),
    "add_big": (r"What is (\d+) \+ (\d+)\?", lambda a, b: a + b),
    "sub_story": (r"has (\d+) \w+ and gives away (\d+)\. How many \w+ does \w+ have left\?", lambda a, b: a - b),
    "two_step": (r"has (\d+) \w+, gets (\d+) more and gives away (\d+)\.", lambda a, b, c: a + b - c),
}


def test_every_level_is_read_back():
    assert set(READ_BACK) == set(yp.LEVELS)
    assert set(yp.MIX) == {*yp.LEVELS, "gsm8k"}


@pytest.mark.parametrize("level", list(yp.LEVELS))
def test_references_are_the_answers(level):
    pattern, answer = READ_BACK[level]
    for p in yp.generated(level, 50):
        numbers = [int(x) for x in re.search(pattern, p["prompt"]).groups()]
        assert p["answer"] == str(answer(*numbers)), p
        assert int(p["answer"]) >= 0
        assert p["prompt"].endswith(yp.ONLY) and p["source"] == f"generated:{level}"


def test_generated_is_deterministic_and_seeded():
    for level in yp.LEVELS:
        assert yp.generated(level, 10) == yp.generated(level, 10)
        assert yp.generated(level, 10, seed=1) != yp.generated(level, 10)
    assert yp.generated("add_big", 3) == yp.generated("add_big", 5)[:3]  # a longer list extends it
    ids = [p["id"] for level in yp.LEVELS for p in yp.generated(level, 20)]
    assert len(set(ids)) == len(ids)


def test_shares_split_the_count():
    assert yp.shares(64) == {"add_tiny": 12, "mul_bare": 12, "add_story": 12, "mul_story": 8, "add_big": 4,
                             "sub_story": 4, "two_step": 4, "gsm8k": 8}
    for count in (1, 7, 16, 65, 100):
        assert sum(yp.shares(count).values()) == count
    assert yp.shares(3, {"a": 1, "b": 1}) == {"a": 2, "b": 1}


def test_mixed_is_deterministic_shuffled_and_skips_the_first_gsm8k_lines():
    problems = yp.mixed(64, GSM8K_TEST)
    assert problems == yp.mixed(64, GSM8K_TEST)
    assert len({p["id"] for p in problems}) == 64
    assert yp.kinds(problems) == {f"generated:{k}": v for k, v in yp.shares(64).items() if k != "gsm8k"} | {
        "gsm8k-test": 8}
    lines = [int(p["source"].split(":")[1]) for p in problems if p["source"].startswith("gsm8k-test:")]
    assert sorted(lines) == list(range(301, 309))
    # shuffled: each half (an engine process's contiguous share) holds easy and hard problems
    for half in (problems[:32], problems[32:]):
        assert {"generated:add_tiny", "gsm8k-test"} <= set(yp.kinds(half))


def test_gsm8k_references_are_the_numbers_after_the_hashes():
    with open(GSM8K_TEST) as f:
        rows = [json.loads(line) for line in f]
    for p in yp.gsm8k(GSM8K_TEST, 5):
        line = int(p["id"].removeprefix("gsm8k-"))
        assert p["prompt"] == rows[line - 1]["question"]
        assert p["answer"] == rows[line - 1]["answer"].rsplit("####", 1)[1].strip().replace(",", "")
    with pytest.raises(ValueError, match="not 10"):
        yp.gsm8k(GSM8K_TEST, 10, first_line=len(rows) - 2)


def test_from_prompts_reads_the_bench_prompts(tmp_path):
    src = tmp_path / "p.jsonl"
    src.write_text(json.dumps({"id": "a", "prompt": "Say hi."}) + "\n"
                   + json.dumps({"question": "1 + 1?", "answer": "So #### 2"}) + "\n"
                   + json.dumps({"id": "c", "messages": [{"role": "user", "content": "x"}], "reference": "7"}) + "\n")
    from semspec.benchmark.runner import load_prompts

    assert yp.from_prompts(load_prompts(src, 2, 1)) == [
        {"id": "1", "prompt": "1 + 1?", "answer": "2", "source": "prompts:2"},
        {"id": "c", "messages": [{"role": "user", "content": "x"}], "answer": "7", "source": "prompts:3"}]
    assert "answer" not in yp.from_prompts(load_prompts(src, 1, 0))[0]  # no reference: none given to semjobs either


def test_the_written_file_is_a_semjobs_input_with_those_references(tmp_path):
    problems = yp.mixed(24, GSM8K_TEST)
    path = yp.write(problems, tmp_path / "problems.jsonl")
    records = list(iter_records(path, 1_000_000))
    assert [str(r.id) for r in records] == [p["id"] for p in problems]
    assert [r.reference for r in records] == [reference_from(p["answer"]) for p in problems]
    assert all(r.meta["source"] == p["source"] for r, p in zip(records, problems))


def test_the_doom_calibration_problems_are_none_of_the_benchmarks():
    bench = yp.mixed(yp.BENCHMARK_COUNT, GSM8K_TEST)
    calibration = yp.calibration_mixed(128, GSM8K_TEST)
    assert calibration == yp.calibration_mixed(128, GSM8K_TEST)
    prompts = [p["prompt"] for p in calibration]
    assert len(set(prompts)) == len(prompts) and not {p["prompt"] for p in bench} & set(prompts)
    # the levels with room give their whole share; the easiest, what the benchmark leaves
    kinds, shares = yp.kinds(calibration), yp.kinds(yp.mixed(128, GSM8K_TEST))
    assert kinds["generated:add_story"] == shares["generated:add_story"] and kinds["gsm8k-test"] == 16
    assert 0 < kinds["generated:add_tiny"] < shares["generated:add_tiny"]
    lines = [int(p["source"].split(":")[1]) for p in calibration if p["source"].startswith("gsm8k-test:")]
    assert min(lines) == 101 and max(lines) < 301
    with pytest.raises(ValueError, match="one of the yield benchmark's"):
        yp.calibration_mixed(2000, GSM8K_TEST)
