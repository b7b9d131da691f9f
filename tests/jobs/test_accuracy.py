"""Accuracy, pass@k and majority vote over an input's samples."""

import pytest

from semjobs.jobs.accuracy import Answer, majority, pass_at_k, summary


def test_pass_at_k_is_the_unbiased_estimator():
    assert pass_at_k(4, 0, 1) == 0 and pass_at_k(4, 4, 4) == 1
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 4) == 1.0  # one right among four: pass@4 certain
    assert pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6)  # C(2,2)/C(4,2) fail together


def test_majority_takes_the_most_frequent_answer_and_breaks_ties_by_sample():
    ans = [Answer("q", 0, "3", False), Answer("q", 1, "5", True), Answer("q", 2, "5", True),
           Answer("q", 3, None, None)]
    assert majority(ans).sample == 1
    tie = [Answer("q", 1, "5", True), Answer("q", 0, "3", False)]
    assert majority(tie).sample == 0  # the earlier sample's answer wins a tie
    assert majority([Answer("q", 0, None, None)]) is None


def test_summary_over_inputs_with_references():
    rows = [
        # q1: 1 of 4 right, majority wrong
        Answer("q1", 0, "1", False), Answer("q1", 1, "1", False), Answer("q1", 2, "2", True),
        Answer("q1", 3, "1", False),
        # q2: 3 of 4 right, majority right
        Answer("q2", 0, "9", True), Answer("q2", 1, "9", True), Answer("q2", 2, "8", False),
        Answer("q2", 3, "9", True),
        # q3: no reference: not counted
        Answer("q3", 0, "4", None),
    ]
    s = summary(rows)
    assert s["inputs"] == 2 and s["samples_checked"] == 8
    assert s["accuracy"] == 0.5 and s["pass_at_k"] == {"1": 0.5, "4": 1.0}
    assert s["majority_accuracy"] == 0.5
    assert summary([Answer("q3", 0, "4", None)]) is None


def test_one_sample_per_input_is_counted_in_the_database_with_the_same_figures(tmp_path, sqlite_db, fake_engine):
    import json

    from click.testing import CliRunner

    from semjobs.cli.main import main
    from semjobs.db.session import session_factory
    from semjobs.jobs import status
    from semjobs.jobs.accuracy import Answer, summary

    src = tmp_path / "q.jsonl"
    # the test double answers with the word count: "a b" -> 2
    src.write_text("".join(json.dumps({"id": f"q{i}", "prompt": "a b", "answer": i}) + "\n" for i in range(4)))
    res = CliRunner().invoke(main, ["run", str(src), "-o", str(tmp_path / "o.jsonl"), "--db", sqlite_db])
    job_id = res.output.strip().splitlines()[-1]
    with session_factory(sqlite_db)() as s:
        fast = status._answers(s, job_id)
        slow = summary(Answer(*row) for row in status.repo.answers(s, job_id))
    assert fast == slow and fast["accuracy"] == 0.25 and fast["inputs"] == 4
