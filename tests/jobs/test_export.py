"""Samples per input, answers checked against references, and the export's filters and
formats: `semjobs run --n` on SQLite with the instant test-double engine, then `export`."""

import json
from collections import Counter
from pathlib import Path

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
    res = invoke("export", job_id, "--db", db, "-o", tmp / "rows.parquet")
    assert res.exit_code == 0, res.output
    pq = datasets.load_dataset("parquet", data_files=str(tmp / "rows.parquet"), split="train")
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


# --- Existing files, symlinks, failures mid-write and stale errors files (issue 46) ---


@pytest.fixture
def finished(tmp_path, sqlite_db, fake_engine):
    """A job of two inputs, both done: (job id, database, its input file)."""
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"q{i}", "prompt": "one two"}) + "\n" for i in range(2)))
    res = invoke("run", src, "-o", tmp_path / "first.jsonl", "--db", sqlite_db)
    assert res.exit_code == 0, res.output
    return res.output.strip().splitlines()[-1], sqlite_db, src


def _leftovers(folder):
    return [p.name for p in folder.iterdir() if p.name.startswith(".tmp-")]


def test_an_existing_output_is_refused_without_force_and_replaced_with_it(finished, tmp_path):
    job_id, db, _ = finished
    out = tmp_path / "mine.jsonl"
    out.write_text("the user's own file\n")
    res = invoke("export", job_id, "--db", db, "-o", out)
    assert res.exit_code == 1 and f"{out} exists" in res.output and "--force" in res.output
    assert out.read_text() == "the user's own file\n" and not (tmp_path / "mine.jsonl.manifest.json").exists()
    res = invoke("export", job_id, "--db", db, "-o", out, "--force")
    assert res.exit_code == 0, res.output
    assert [json.loads(x)["id"] for x in open(out)] == ["q0", "q1"]
    assert not _leftovers(tmp_path)


def test_a_symlink_at_an_output_path_is_replaced_never_written_through(finished, tmp_path):
    job_id, db, _ = finished
    precious, other = tmp_path / "precious.txt", tmp_path / "other.txt"
    precious.write_text("keep me\n")
    other.write_text("keep me too\n")
    out = tmp_path / "link.jsonl"
    out.symlink_to(precious)
    (tmp_path / "link.jsonl.manifest.json").symlink_to(other)
    res = invoke("export", job_id, "--db", db, "-o", out)
    assert res.exit_code == 1 and "--force" in res.output
    res = invoke("export", job_id, "--db", db, "-o", out, "--force")
    assert res.exit_code == 0, res.output
    assert not out.is_symlink() and [json.loads(x)["id"] for x in open(out)] == ["q0", "q1"]
    assert not (tmp_path / "link.jsonl.manifest.json").is_symlink()
    assert precious.read_text() == "keep me\n" and other.read_text() == "keep me too\n"
    dangling = tmp_path / "dangling.jsonl"
    dangling.symlink_to(tmp_path / "nowhere" / "x")
    res = invoke("export", job_id, "--db", db, "-o", dangling)
    assert res.exit_code == 1 and f"{dangling} exists" in res.output


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_failure_mid_write_leaves_no_file_that_looks_complete(finished, tmp_path, monkeypatch, fmt):
    from semjobs.jobs import export

    job_id, db, _ = finished
    real, calls = export.result_line, []

    def fails_on_the_second_row(job, kept):
        calls.append(kept)
        if len(calls) == 2:
            raise RuntimeError("disk gone")
        return real(job, kept)

    monkeypatch.setattr(export, "result_line", fails_on_the_second_row)
    out = tmp_path / f"o.{fmt}"
    with pytest.raises(RuntimeError, match="disk gone"):
        export.export_job(job_id, out, url=db, fmt=fmt)
    assert not out.exists() and not (tmp_path / f"o.{fmt}.manifest.json").exists() and not _leftovers(tmp_path)
    # with --force, the earlier file stays whole until the new one is
    out.write_text("an earlier export\n")
    calls.clear()
    with pytest.raises(RuntimeError, match="disk gone"):
        export.export_job(job_id, out, url=db, fmt=fmt, force=True)
    assert out.read_text() == "an earlier export\n" and not _leftovers(tmp_path)


def test_an_earlier_exports_errors_file_is_removed_when_this_one_has_none(finished, tmp_path):
    job_id, db, _ = finished
    src = tmp_path / "failing.jsonl"
    src.write_text(json.dumps({"id": "a", "prompt": "one"}) + "\n" + json.dumps({"id": "b", "prompt": "FAIL"}) + "\n")
    res = invoke("run", src, "-o", tmp_path / "o.jsonl", "--db", db)
    assert res.exit_code == 3, res.output
    errors = tmp_path / "o.jsonl.errors.jsonl"
    assert [json.loads(x)["id"] for x in open(errors)] == ["b"]
    res = invoke("export", job_id, "--db", db, "-o", tmp_path / "o.jsonl")  # the errors file counts too
    assert res.exit_code == 1 and "o.jsonl exists" in res.output and errors.exists()
    res = invoke("export", job_id, "--db", db, "-o", tmp_path / "o.jsonl", "--force")
    assert res.exit_code == 0, res.output
    assert not errors.exists()  # it would have said this export's job had a failed item
    explicit = tmp_path / "explicit-errors.jsonl"
    explicit.write_text("stale\n")
    res = invoke("export", job_id, "--db", db, "-o", tmp_path / "p.jsonl", "--errors", explicit)
    assert res.exit_code == 1 and f"{explicit} exists" in res.output and explicit.read_text() == "stale\n"
    res = invoke("export", job_id, "--db", db, "-o", tmp_path / "p.jsonl", "--errors", explicit, "--force")
    assert res.exit_code == 0 and explicit.read_text() == ""  # asked for: written, empty


def test_the_jobs_input_file_is_never_replaced(finished, tmp_path):
    job_id, db, src = finished
    before = src.read_text()
    res = invoke("export", job_id, "--db", db, "-o", src, "--force")
    assert res.exit_code == 1 and "is the job's input file" in res.output and src.read_text() == before
    res = invoke("run", src, "-o", src, "--db", db, "--force")
    assert res.exit_code == 1 and "is the job's input file" in res.output and src.read_text() == before


def test_an_hf_export_replaces_a_file_only_with_force_and_never_a_full_directory(finished, tmp_path):
    job_id, db, _ = finished
    out = tmp_path / "ds"
    out.write_text("a file\n")
    res = invoke("export", job_id, "--db", db, "-o", out, "--format", "hf")
    assert res.exit_code == 1 and "--force" in res.output and out.read_text() == "a file\n"
    res = invoke("export", job_id, "--db", db, "-o", out, "--format", "hf", "--force")
    assert res.exit_code == 0 and (out / "dataset_info.json").exists(), res.output
    res = invoke("export", job_id, "--db", db, "-o", out, "--format", "hf", "--force")
    assert res.exit_code == 1 and "not an empty directory" in res.output and (out / "README.md").exists()
    assert not _leftovers(tmp_path)


def test_two_formats_of_one_job_keep_their_own_companion_files(finished, tmp_path):
    job_id, db, _ = finished
    for fmt in ("jsonl", "parquet"):
        res = invoke("export", job_id, "--db", db, "-o", tmp_path / f"out.{fmt}")
        assert res.exit_code == 0, res.output
        assert json.loads((tmp_path / f"out.{fmt}.manifest.json").read_text())["job"]["id"] == job_id


def test_an_export_naming_one_file_twice_or_the_database_is_refused_even_with_force(finished, tmp_path):
    job_id, db, _ = finished
    out = tmp_path / "x.jsonl"
    res = invoke("export", job_id, "--db", db, "-o", out, "--errors", out, "--force")
    assert res.exit_code == 1 and "named for two of the export's files" in res.output and not out.exists()
    database = Path(db.removeprefix("sqlite:///"))
    before = database.read_bytes()
    res = invoke("export", job_id, "--db", db, "-o", database, "--force")
    assert res.exit_code == 1 and "is the job database" in res.output and database.read_bytes() == before


def test_a_file_that_appears_while_the_export_writes_is_not_replaced_without_force(finished, tmp_path, monkeypatch):
    from semjobs.jobs import export

    job_id, db, _ = finished
    out = tmp_path / "o.jsonl"
    real = export.result_line

    def another_writer_meanwhile(job, kept):  # after the check, before the commit
        if not out.exists():
            out.write_text("someone else's\n")
        return real(job, kept)

    monkeypatch.setattr(export, "result_line", another_writer_meanwhile)
    with pytest.raises(ValueError, match="appeared during the export"):
        export.export_job(job_id, out, url=db)
    assert out.read_text() == "someone else's\n" and not (tmp_path / "o.jsonl.manifest.json").exists()
    assert not _leftovers(tmp_path)
