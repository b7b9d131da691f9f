"""Samples per input, answers checked against references, and the export's filters and
formats: `semjobs run --n` on SQLite with the instant test-double engine, then `export`."""

import json
from collections import Counter

import pytest
from click.testing import CliRunner

from semjobs.cli.main import main
from semjobs.jobs.export_fields import EXPORT_FIELDS


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


# The test double answers with the number of words in the prompt, plus seed % 3 for the
# seeds of later samples: four words, so sample 0 says 4 and the others 4, 5 or 6.
QUESTIONS = [
    {"id": "right", "prompt": "one two three four", "answer": "Four of them.\n#### 4"},
    {"id": "wrong", "prompt": "one two three four", "metadata": {"answer": 9}},
    {"id": "unknown", "prompt": "one two three four"},
]


@pytest.fixture
def sampled(tmp_path, sqlite_db, fake_engine):
    src = tmp_path / "q.jsonl"
    src.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    out = tmp_path / "all.jsonl"
    res = invoke("run", src, "-o", out, "--db", sqlite_db, "--n", 4, "--temperature", 0.7)
    assert res.exit_code == 0, res.output
    assert "answers: " in res.output and "pass@4" in res.output  # the run's summary
    return res.output.strip().splitlines()[-1], [json.loads(x) for x in open(out)], sqlite_db, tmp_path


def test_every_input_has_n_samples_with_their_own_seed_and_checked_answers(sampled):
    job_id, rows, db, _ = sampled
    assert [(r["id"], r["sample"]) for r in rows] == [(q["id"], s) for q in QUESTIONS for s in range(4)]
    assert list(rows[0])[: len(EXPORT_FIELDS)] == list(EXPORT_FIELDS)
    for qid in ("right", "wrong", "unknown"):
        texts = [r["output"] for r in rows if r["id"] == qid]
        assert len(set(texts)) == 4  # four seeds, four different samples
    # later samples' seeds depend on the input's id: the same prompt under another id differs
    assert [r["output"] for r in rows if r["id"] == "right"] != [r["output"] for r in rows if r["id"] == "wrong"]
    for r in rows:
        assert r["reasoning"].startswith("Let me think.") and r["content"].startswith("The answer is")
        want = None if r["reference"] is None else r["final_answer"] == r["reference"]
        assert r["correct"] is want
    assert {r["reference"] for r in rows} == {"4", "9", None}
    assert sum(r["correct"] is True for r in rows if r["id"] == "right") >= 1  # sample 0 says 4
    st = json.loads(invoke("status", job_id, "--json", "--db", db).output)
    checked = [r for r in rows if r["correct"] is not None]
    right = sum(r["correct"] for r in checked)
    ans = st["answers"]
    assert ans["inputs"] == 2 and ans["samples_checked"] == 8
    assert ans["accuracy"] == round(right / 8, 4)
    assert ans["pass_at_k"]["4"] == 0.5  # "right" has a right sample, "wrong" none
    assert "pass@4 50.0%" in invoke("status", job_id, "--db", db).output


def test_only_correct_incorrect_and_majority(sampled):
    job_id, rows, db, tmp = sampled
    for only, want in (("correct", True), ("incorrect", False)):
        res = invoke("export", job_id, "--db", db, "-o", tmp / f"{only}.jsonl", "--only", only)
        assert res.exit_code == 0, res.output
        got = [json.loads(x) for x in open(tmp / f"{only}.jsonl")]
        assert [(g["id"], g["sample"]) for g in got] == [(r["id"], r["sample"]) for r in rows
                                                         if r["correct"] is want]
    res = invoke("export", job_id, "--db", db, "-o", tmp / "major.jsonl", "--majority")
    assert res.exit_code == 0, res.output
    got = [json.loads(x) for x in open(tmp / "major.jsonl")]
    assert [g["id"] for g in got] == ["right", "wrong", "unknown"]
    for g in got:
        votes = Counter(r["final_answer"] for r in rows if r["id"] == g["id"])
        assert votes[g["final_answer"]] == max(votes.values())


def test_batch_shape_puts_the_samples_in_choices(sampled):
    job_id, rows, db, tmp = sampled
    res = invoke("export", job_id, "--db", db, "-o", tmp / "b.jsonl", "--format", "batch")
    assert res.exit_code == 0, res.output
    lines = [json.loads(x) for x in open(tmp / "b.jsonl")]
    assert [x["custom_id"] for x in lines] == ["right", "wrong", "unknown"]
    for x in lines:
        choices = x["response"]["body"]["choices"]
        assert [c["index"] for c in choices] == [0, 1, 2, 3]
        assert [c["message"]["content"] for c in choices] == [r["output"] for r in rows if r["id"] == x["custom_id"]]
        assert x["response"]["body"]["usage"]["completion_tokens"] == sum(
            r["usage"]["completion_tokens"] for r in rows if r["id"] == x["custom_id"])


def test_hf_dataset_and_parquet_load_with_datasets(sampled):
    import datasets

    job_id, rows, db, tmp = sampled
    res = invoke("export", job_id, "--db", db, "-o", tmp / "ds", "--format", "hf", "--only", "correct")
    assert res.exit_code == 0, res.output
    ds = datasets.load_from_disk(str(tmp / "ds"))
    assert ds.num_rows == sum(r["correct"] is True for r in rows) and all(ds["correct"])
    card = (tmp / "ds" / "README.md").read_text()
    assert job_id in card and "pass@4" in card and "only correct" in card and "fake-instant" in card
    res = invoke("export", job_id, "--db", db, "-o", tmp / "all.parquet")
    assert res.exit_code == 0, res.output
    pq = datasets.load_dataset("parquet", data_files=str(tmp / "all.parquet"), split="train")
    assert pq.num_rows == 12 and pq["id"] == [r["id"] for r in rows] and pq["sample"] == [r["sample"] for r in rows]
    again = invoke("export", job_id, "--db", db, "-o", tmp / "ds", "--format", "hf")
    assert again.exit_code != 0 and "not an empty directory" in again.output


def test_n_needs_sampling_and_filters_need_references(tmp_path, sqlite_db, fake_engine):
    src = tmp_path / "q.jsonl"
    src.write_text(json.dumps({"id": "a", "prompt": "x"}) + "\n")
    res = invoke("run", src, "-o", tmp_path / "o.jsonl", "--db", sqlite_db, "--n", 2, "--temperature", 0)
    assert res.exit_code == 2 and "--n" in res.output and "temperature" in res.output
    res = invoke("run", src, "-o", tmp_path / "o.jsonl", "--db", sqlite_db)
    job_id = res.output.strip().splitlines()[-1]
    res = invoke("export", job_id, "--db", sqlite_db, "-o", tmp_path / "c.jsonl", "--only", "correct")
    assert res.exit_code == 1 and "reference" in res.output


def test_the_readme_documents_every_export_field():
    from tests.conftest import ROOT

    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Output"):]
    assert all(f"| `{name}` |" in table for name in EXPORT_FIELDS)


def test_parquet_batches_share_one_schema(tmp_path):
    import pyarrow.parquet as pq

    from semjobs.jobs.export import _ParquetSink

    sink = _ParquetSink(tmp_path / "x.parquet", batch=1)  # every row its own batch
    sink.write({"id": 1, "sample": 0, "correct": None, "usage": {"total_tokens": 3}})
    sink.write({"id": "b", "sample": 1, "correct": True, "meta": {"src": "x"}})
    sink.close()
    t = pq.read_table(tmp_path / "x.parquet")
    assert t.column("id").to_pylist() == ["1", "b"] and t.column("correct").to_pylist() == [None, True]
    assert t.column("meta").to_pylist() == [None, '{"src": "x"}']
    assert t.column_names[: len(EXPORT_FIELDS)] == list(EXPORT_FIELDS)


def test_an_empty_selection_writes_no_dataset(tmp_path, sqlite_db, fake_engine):
    src = tmp_path / "q.jsonl"
    src.write_text(json.dumps({"id": "a", "prompt": "one two", "answer": 999}) + "\n")
    res = invoke("run", src, "-o", tmp_path / "o.jsonl", "--db", sqlite_db)
    job_id = res.output.strip().splitlines()[-1]
    res = invoke("export", job_id, "--db", sqlite_db, "-o", tmp_path / "none", "--format", "hf", "--only", "correct")
    assert res.exit_code == 1 and "no sample to export" in res.output
    assert not (tmp_path / "none").exists()
