"""Queue naming: one queue per model pair, so a worker only takes jobs for the models it has
loaded. Kept free of Celery imports so `jobs` and `cli` can use it cheaply."""

from __future__ import annotations

import re

from semjobs.settings import Settings, settings as _settings

# The queue a `semjobs run` job records: it decodes in its own process, through no broker.
EMBEDDED_QUEUE = "embedded"


def _slug(model: str | None) -> str:
    if not model:
        return "embedded"
    name = model.rstrip("/").split("/")[-1]
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name)[:60] or "model"


def queue_name(s: Settings | None = None) -> str:
    s = s or _settings
    if s.queue:
        return s.queue
    return f"semjobs.{_slug(s.target_model)}+{_slug(s.draft_model)}"
