"""Thin Celery tasks: a chunk of item positions -> the shared per-item code."""

from __future__ import annotations

import os
import signal
import threading
import time

from celery.signals import worker_init, worker_shutting_down
from celery.utils.log import get_task_logger
from sqlalchemy.exc import OperationalError

from semjobs.settings import settings
from semjobs.worker import liveness
from semjobs.worker.celery import app
from semjobs.worker import engine as engines
from semjobs.worker.engine import EngineLoadError
from semjobs.worker.publish import CALIBRATE, RUN_CHUNK, requeue
from semjobs.worker.process import fail_unstarted, job_engine_request, run_items, worker_name
from semjobs.worker.queues import queue_name

log = get_task_logger(__name__)

# Set when this worker begins a warm shutdown (SIGTERM, `docker stop`): the running chunk
# stops after its current item and hands the rest back to the queue, so the task ends (and
# is acknowledged) quickly instead of being killed mid-chunk and redelivered only after the
# visibility timeout. Seen by tasks running in the main process (the solo pool, one per GPU).
_shutting_down = False


@worker_init.connect
def _on_start(**_kwargs) -> None:
    # a worker's queues carry the methods it serves: their engines split the GPU as one
    # (prefork children fork after this and inherit it)
    engines.plan_as_worker()


@worker_shutting_down.connect
def _on_shutdown(**_kwargs) -> None:
    global _shutting_down
    _shutting_down = True


# Both tasks wait out a database that is away; an engine that cannot load is tried a few
# times (load_or_give_up), then what needed it fails with the load error as its reason.
# A chunk that needs another engine than the one this worker's other chunks decode with is
# handed back after this long (to be taken here or by another worker).
ENGINE_BUSY_RETRY_S = 5
RETRYING = dict(bind=True, autoretry_for=(OperationalError,), retry_backoff=5, retry_backoff_max=300,
                max_retries=10)


def load_or_give_up(task, what: str, request: tuple = ()) -> str | None:
    """Load this process's engine for ``request`` (``semjobs.worker.engine.get_engine``'s arguments;
    kept for the task's own call); on failure
    retry the task later, up to ``settings.engine_load_attempts`` tries, then return the load
    error for the caller to fail ``what`` with. None when the engine loaded."""
    try:
        engines.get_engine(*request)
        return None
    except EngineLoadError as e:
        tries = task.request.retries + 1
        if tries < settings.engine_load_attempts:
            log.warning("%s: %s; trying again (%d of %d)", what, e, tries + 1, settings.engine_load_attempts)
            raise task.retry(exc=e, countdown=settings.engine_retry_s * 2 ** (tries - 1), max_retries=None)
        log.error("%s: %s; gave up after %d tries", what, e, tries)
        return f"{e} (gave up after {tries} tries on worker {liveness.name() or worker_name()})"


def _queue_of(task) -> str:
    """The queue ``task``'s message came from."""
    return (task.request.delivery_info or {}).get("routing_key") or queue_name()


@app.task(name=RUN_CHUNK, **RETRYING)
def run_chunk(self, job_id: str, seqs: list[int]) -> dict:
    try:
        load_error = load_or_give_up(self, f"job {job_id} chunk {seqs[:1]}", job_engine_request(job_id))
        if load_error is not None:
            failed = fail_unstarted(job_id, seqs, load_error)
            return {"done": 0, "failed": failed}
        # Stop starting new items after half the visibility timeout: a task must end well
        # before Redis would hand its message to a second worker.
        deadline = time.monotonic() + settings.visibility_timeout_s / 2
        # The name this process beats under, so a dead worker's items are found (semjobs.worker.recovery).
        name = liveness.name() or worker_name()
        report = run_items(job_id, seqs, worker=name, deadline=deadline,
                           should_stop=lambda: _shutting_down)
    except engines.EngineBusy as e:
        # Nothing started: hand the chunk back as a fresh message after a pause, for this
        # worker once the other job's chunks are done or for another. (Celery's retry would
        # spend the retries that load failures and database outages count on.)
        log.info("job %s chunk %s: %s; handed back in %ss", job_id, seqs[:1], e, ENGINE_BUSY_RETRY_S)
        time.sleep(ENGINE_BUSY_RETRY_S)
        requeue(_queue_of(self), job_id, seqs)
        return {"done": 0, "failed": 0}
    if report.left:
        requeue(_queue_of(self), job_id, report.left)
    log.info(
        "job %s chunk %s: done=%d failed=%d skipped=%d duplicates=%d late=%d unneeded=%d over_budget=%d%s",
        job_id, seqs[:1], report.done, report.failed, report.skipped, report.duplicates, report.late,
        report.unneeded, report.over_budget,
        f" cancelled ({report.aborted} aborted mid-decode)" if report.cancelled else "",
    )
    if report.hung:
        log.error("job %s chunk %s: the engine made no progress for %g s (SEMJOBS_PROGRESS_TIMEOUT_S); "
                  "handed back %d item(s); this worker stops, to be started again fresh",
                  job_id, seqs[:1], settings.progress_timeout_s, len(report.left))
        stop_worker(self)
    return {"done": report.done, "failed": report.failed, "unneeded": report.unneeded,
            "over_budget": report.over_budget}


def stop_worker(task) -> None:
    """End this worker process after its engine hung: the thread stuck in the engine cannot
    be stopped, nor the engine freed. As SIGTERM does: warm, so every other chunk hands back
    what it holds first; `semjobs worker`'s supervisor (on a CPU), Celery's prefork parent
    (-c N) or the container's restart policy starts a fresh one. Not for a task run in its
    caller's own process (eager: tests)."""
    if task.request.is_eager:
        return
    os.kill(os.getpid(), signal.SIGTERM)


# One calibration question at a time in a process: the threads pool runs several tasks at
# once, and a vLLM engine is stepped by one thread (chunks share theirs through the batch loop).
_calibrating = threading.Lock()


@app.task(name=CALIBRATE, **RETRYING)
def calibrate(self, calibration_id: str, question_id: str) -> str:
    """One question of a probe calibration with this worker's pair (semjobs.jobs.calibration), on the
    engine the pair's semspec decodes with, storing the layers the calibration reads."""
    from semjobs.jobs.calibration import calibration_layers, fail_question, run_question

    layers = calibration_layers(calibration_id)
    if layers is None:  # no such calibration (deleted meanwhile)
        return "skipped"
    request = ("semspec", None, layers)
    try:
        load_error = load_or_give_up(self, f"calibration {calibration_id} question {question_id}", request)
        if load_error is not None:
            return fail_question(calibration_id, question_id, load_error)
        # held: a job's chunk asking for another engine meanwhile gets EngineBusy, not this one dropped
        with engines.in_use(*request) as engine:
            models = calibration_models(engine)
            if models is None:
                return fail_question(calibration_id, question_id, f"this worker's engine ({type(engine).__name__}) "
                                     "cannot sample for a calibration")
            with _calibrating:
                outcome = run_question(calibration_id, question_id, models,
                                       worker=liveness.name() or worker_name())
    except engines.EngineBusy as e:  # a job's chunks decode with the engine this would drop
        log.info("calibration %s question %s: %s; trying again in %ss", calibration_id, question_id, e,
                 ENGINE_BUSY_RETRY_S)
        raise self.retry(countdown=ENGINE_BUSY_RETRY_S, max_retries=None)
    except EngineLoadError as e:  # reloaded after another chunk swapped it out, and failed
        return fail_question(calibration_id, question_id, str(e))
    log.info("calibration %s question %s: %s", calibration_id, question_id, outcome)
    if outcome == "busy":  # a worker that beats runs it: look again once it could be dead
        raise self.retry(countdown=settings.worker_dead_after_s, max_retries=None)
    return outcome


def calibration_models(engine):
    """The pair as a calibration samples it, when ``engine`` is vLLM's step engine; else None
    (another engine factory's, or no vLLM here: the question fails with the reason, never
    with an import error that no retry mends)."""
    from semspec.engine.token_engine import vllm_installed

    if not vllm_installed():
        return None
    from semspec.calibration.vllm_models import VLLMModels
    from semspec.engine.step_engine import VLLMStepEngine

    return VLLMModels(engine) if isinstance(engine, VLLMStepEngine) else None
