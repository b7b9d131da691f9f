"""Queue naming: one queue per model pair and method, so a worker only takes jobs for the
models it has loaded, and a worker that serves some methods only (``settings.methods``) only
those. Kept free of Celery imports so `jobs` and `cli` can use it cheaply.

    semjobs.<target>+<draft>.<method>      a job of that method
    semjobs.<target>+<draft>.calibrate     a probe calibration's questions (the step engines)
    semjobs.<target>+<draft>               jobs queued before queues were per method

``settings.queue`` names one queue for all of them instead (a worker then serves every method).
"""

from __future__ import annotations

import re

from semjobs.settings import Settings, settings as _settings
from semspec.types import METHODS, VLLM_STEP_METHODS

# The queue a `semjobs run` job records: it decodes in its own process, through no broker.
EMBEDDED_QUEUE = "embedded"
# The suffix of a probe calibration's queue: its questions run on the step-level methods' engines.
CALIBRATION = "calibrate"


def _slug(model: str | None) -> str:
    if not model:
        return "embedded"
    name = model.rstrip("/").split("/")[-1]
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name)[:60] or "model"


def queue_name(s: Settings | None = None, kind: str | None = None) -> str:
    """The queue of a job of method ``kind`` (or of a calibration: ``CALIBRATION``) for the
    settings' pair; None: the pair's own queue (jobs queued before queues were per method)."""
    s = s or _settings
    if s.queue:
        return s.queue
    pair = f"semjobs.{_slug(s.target_model)}+{_slug(s.draft_model)}"
    return f"{pair}.{kind}" if kind else pair


def served_methods(s: Settings | None = None) -> tuple[str, ...]:
    """The methods a worker of these settings decodes (all unless ``settings.methods`` says)."""
    s = s or _settings
    return tuple(s.methods or METHODS)


def worker_queues(s: Settings | None = None) -> list[str]:
    """The queues a worker of these settings consumes: its methods', the calibrations' where it
    serves a step-level method (it holds their engines), and the pair's own where it serves
    every method."""
    s = s or _settings
    if s.queue:
        return [s.queue]
    methods = served_methods(s)
    queues = [queue_name(s, m) for m in methods]
    if set(methods) & set(VLLM_STEP_METHODS):
        queues.append(queue_name(s, CALIBRATION))
    if set(methods) == set(METHODS):
        queues.append(queue_name(s))
    return queues
