"""semjobs.worker.tasks.run_chunk's own decisions, run eagerly (no broker)."""

from __future__ import annotations

from semjobs.worker import engine as engines
from semjobs.worker import tasks


def test_a_chunk_whose_engine_is_busy_is_handed_back_whole(monkeypatch):
    """A chunk that would swap away the engine other chunks decode with starts nothing and is
    sent again as a fresh message (Celery's retry would spend the load and database retries)."""
    sent = []

    def busy(*_args, **_kwargs):
        raise engines.EngineBusy("busy")

    monkeypatch.setattr(tasks, "job_engine_request", lambda job_id: ("token_sd", 4))
    monkeypatch.setattr(tasks, "load_or_give_up", busy)
    monkeypatch.setattr(tasks, "requeue", lambda queue, job_id, seqs: sent.append((queue, job_id, seqs)))
    monkeypatch.setattr(tasks, "ENGINE_BUSY_RETRY_S", 0)
    result = tasks.run_chunk.apply(args=("job-1", [3, 4, 5])).get()
    assert result == {"done": 0, "failed": 0}
    assert sent == [(tasks.queue_name(), "job-1", [3, 4, 5])]


def test_only_the_step_engine_samples_for_a_calibration(monkeypatch):
    """vLLM's step engine gives the pair; another engine (a test double, another factory's)
    gives None, and so does a worker without vLLM, without importing vLLM's modules: the
    question then fails with the reason rather than an import error no retry mends."""
    import sys

    from semspec.calibration import vllm_models
    from semspec.engine import token_engine
    from semspec.engine.step_engine import VLLMStepEngine

    monkeypatch.setattr(vllm_models, "VLLMModels", lambda engine: ("pair of", engine))
    step_engine = object.__new__(VLLMStepEngine)
    assert tasks.calibration_models(step_engine) == ("pair of", step_engine)
    assert tasks.calibration_models(object()) is None
    monkeypatch.setattr(token_engine, "vllm_installed", lambda: False)
    monkeypatch.setitem(sys.modules, "semspec.engine.step_engine", None)  # importing it now raises
    assert tasks.calibration_models(step_engine) is None


def test_a_chunk_whose_engine_hung_requeues_the_rest_and_stops_the_worker(monkeypatch):
    """The watchdog's end in a worker: what the chunk handed back goes out again for other
    workers, and this worker, whose engine thread is stuck for good, stops to be started
    afresh (by SIGTERM: warm, so its other chunks hand back what they hold)."""
    from semjobs.worker.process import ChunkReport

    sent, stopped = [], []
    monkeypatch.setattr(tasks, "job_engine_request", lambda job_id: ("ar", None))
    monkeypatch.setattr(tasks, "load_or_give_up", lambda *_args: None)
    monkeypatch.setattr(tasks, "run_items", lambda *_a, **_k: ChunkReport(done=1, failed=1, left=[6, 7], hung=True))
    monkeypatch.setattr(tasks, "requeue", lambda queue, job_id, seqs: sent.append((job_id, seqs)))
    monkeypatch.setattr(tasks, "stop_worker", stopped.append)
    assert tasks.run_chunk.apply(args=("job-1", [4, 5, 6, 7])).get() == {"done": 1, "failed": 1, "unneeded": 0,
                                                                         "over_budget": 0}
    assert sent == [("job-1", [6, 7])] and len(stopped) == 1
