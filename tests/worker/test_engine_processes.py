"""`semjobs run` across engine processes: how many, and that a real multi-process run on SQLite
with the instant test-double engine stores every item once, survives a killed child and
resumes the rest (subprocesses, no servers)."""

import json
import os
import re

import pytest
from sqlalchemy import select

from tests.conftest import FAKE_ENGINE, ROOT, run_cli


@pytest.mark.parametrize("cores, cpu, items, processes, threads, expected", [
    (4, True, 100, None, None, (4, 1)),   # one engine per core, one thread each
    (4, True, 20, None, None, (2, 1)),    # at least 8 items an engine
    (4, True, 3, None, None, (1, 1)),     # a small job: one engine, one thread
    (4, True, 100, None, 2, (2, 2)),      # SEMJOBS_THREADS=2: one engine per two cores
    (4, True, None, None, None, (4, 1)),  # a worker: no item count
    (4, False, 100, None, None, (1, None)),  # an accelerator: one engine, torch's threads
    (4, True, 100, 2, None, (2, 2)),      # --processes 2 shares the cores out
    (4, True, 100, 1, None, (1, None)),   # --processes 1: torch's threads
    (1, True, 100, None, None, (1, 1)),
])
def test_plan(monkeypatch, cores, cpu, items, processes, threads, expected):
    from semjobs.settings import settings
    from semjobs.worker import engine_processes

    monkeypatch.setattr(engine_processes, "usable_cores", lambda: cores)
    monkeypatch.setattr(engine_processes, "_runs_on_cpu", lambda: cpu)
    monkeypatch.setattr(settings, "processes", processes)
    monkeypatch.setattr(settings, "threads", threads)
    assert engine_processes.plan(items) == expected


def _prompts(path, n, kill=()):
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"p{i}", "prompt": f"question {i}" + (" KILL" if i in kill else "")}) + "\n")


def _items(db_path):
    from semjobs.db.models import Item
    from semjobs.db.session import session_factory

    with session_factory(f"sqlite:///{db_path}")() as s:
        return s.execute(select(Item.seq, Item.status, Item.attempts, Item.worker)).all()


def _env(**extra):
    return dict(os.environ, PYTHONPATH=str(ROOT), SEMJOBS_ENGINE_FACTORY=FAKE_ENGINE,
                FAKE_ENGINE_DELAY_S="0.2", **extra)


def test_two_engine_processes_store_every_item_once(tmp_path):
    src, out, db = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "db.sqlite"
    _prompts(src, 6)
    proc = run_cli(["run", str(src), "-o", str(out), "--db", f"sqlite:///{db}", "--processes", "2",
                    "--batch-size", "2", "--n", "2", "--temperature", "0.5"], _env())
    assert "in 2 processes, 1 torch thread(s) each" in proc.stderr
    rows = [json.loads(line) for line in open(out)]
    assert sorted((r["id"], r["sample"]) for r in rows) == [(f"p{i}", k) for i in range(6) for k in (0, 1)]
    items = _items(db)
    assert {status for _, status, _, _ in items} == {"done"}
    assert {attempts for _, _, attempts, _ in items} == {1}
    worker_of = {seq: worker for seq, _, _, worker in items}
    assert len(set(worker_of.values())) == 2  # two processes decoded
    # an input's two samples (adjacent seqs) went to one process, which prefills their prompt once
    assert all(worker_of[2 * i] == worker_of[2 * i + 1] for i in range(6))


def test_engine_processes_take_the_items_as_they_go(tmp_path):
    """A process whose items are slow does not hold the others back: the items are handed out
    as each process has started what it holds, so the fast one takes the most."""
    src, out, db = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "db.sqlite"
    with open(src, "w") as f:
        for i in range(12):  # the first input's prompt is slow (SLOW: 3 s), the others 0.2 s
            f.write(json.dumps({"id": f"p{i}", "prompt": f"question {i}" + (" SLOW" if i == 0 else "")}) + "\n")
    run_cli(["run", str(src), "-o", str(out), "--db", f"sqlite:///{db}", "--processes", "2", "--batch-size", "1"],
            _env())
    items = _items(db)
    assert {status for _, status, _, _ in items} == {"done"}
    slow = next(worker for seq, _, _, worker in items if seq == 0)
    assert sum(worker != slow for _, _, _, worker in items) >= 9
    manifest = json.loads((tmp_path / "out.jsonl.manifest.json").read_text())
    assert manifest["identities"]["torch_threads"] == "1"


def test_a_killed_engine_process_loses_nothing_and_the_rerun_finishes(tmp_path):
    src, out, db = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "db.sqlite"
    _prompts(src, 8, kill={5})  # item 5 SIGKILLs the process decoding it, every time
    args = ["run", str(src), "-o", str(out), "--db", f"sqlite:///{db}", "--processes", "2",
            "--batch-size", "1"]
    first = run_cli(args, _env(SEMJOBS_MAX_ATTEMPTS="1"), check=False)
    assert first.returncode == 1
    assert re.search(r"engine process [01] exited with code -9", first.stderr)  # whichever took item 5
    assert "run the same command again" in first.stderr
    status = {seq: s for seq, s, _, _ in _items(db)}
    assert all(status[seq] == "done" for seq in (0, 1, 2, 3, 4))
    # the lost process's item waits, and the one it had taken next (if it had); the other
    # process took the rest
    assert status[5] == "running" and [status[6], status[7]].count("pending") <= 1
    left = 1 + [status[6], status[7]].count("pending")
    second = run_cli([*args, "--force"], _env(SEMJOBS_MAX_ATTEMPTS="1"), check=False)
    assert second.returncode == 3  # some items failed (item 5), the rest done
    assert "resuming job" in second.stderr and f"{left} of 8 items left" in second.stderr
    items = {seq: (s, attempts) for seq, s, attempts, _ in _items(db)}
    assert items[5] == ("failed", 2)  # past max_attempts: failed, not run a third time
    assert items[6] == items[7] == ("done", 1)
    ids = [json.loads(line)["id"] for line in open(out)]
    assert sorted(ids) == sorted(f"p{i}" for i in range(8) if i != 5)  # each once


def test_an_engine_that_cannot_load_in_the_children_stores_no_job(tmp_path):
    src, db = tmp_path / "in.jsonl", tmp_path / "db.sqlite"
    _prompts(src, 4)
    env = _env()
    env["SEMJOBS_ENGINE_FACTORY"] = "no_such_module:Engine.load"
    proc = run_cli(["run", str(src), "-o", str(tmp_path / "o.jsonl"), "--db", f"sqlite:///{db}",
                    "--processes", "2"], env, check=False)
    assert proc.returncode == 1
    assert "could not load the engine" in proc.stderr and "nothing was stored" in proc.stderr
    assert not db.exists()  # the database is created only once the run is accepted
