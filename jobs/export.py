"""Export: one line per finished item keyed by the input's id; failed and cancelled items go
to an errors file. Jobs submitted as OpenAI Batch lines are exported in the Batch output
shape (`custom_id`, `response.body` a chat.completion, `error`). A `.parquet` output path
writes the same records as a Parquet table (nested fields as JSON text)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from db import repo
from db.models import Item, ItemStats, Job, Output
from db.session import session_factory
from jobs.schema import OPENAI_BATCH


@dataclass
class ExportReport:
    results: int = 0
    errors: int = 0
    unfinished: int = 0
    out: Path | None = None
    errors_path: Path | None = None
    manifest_path: Path | None = None


def _stats(stats: ItemStats | None) -> dict[str, Any]:
    if stats is None:
        return {}
    d = {k: getattr(stats, k) for k in repo.STAT_SUMS}
    d["phase_seconds"] = stats.phase_seconds
    d["tokens_per_s"] = (
        round(stats.generated_tokens / stats.wall_seconds, 3) if stats.wall_seconds > 0 else None
    )
    return d


def _usage(stats: ItemStats | None) -> dict[str, int]:
    p = stats.prompt_tokens if stats else 0
    c = stats.generated_tokens if stats else 0
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def _steps(session, item: Item) -> list[dict]:
    return [
        {k: getattr(s, k) for k in repo.STEP_TYPES}
        for s in repo.steps_for(session, item.id)
    ]


def result_line(job: Job, item: Item, out: Output, stats: ItemStats | None,
                steps: list[dict] | None = None) -> dict:
    req = item.request
    if job.input_format == OPENAI_BATCH:
        created = int(out.created_at.timestamp()) if out.created_at else 0
        body = {
            "id": f"chatcmpl-{job.id}-{item.seq}",
            "object": "chat.completion",
            "created": created,
            "model": (out.models or {}).get("target") or req.get("meta", {}).get("model") or "semjobs",
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": out.text},
                "finish_reason": "length" if out.finish_reason == "length" else "stop",
            }],
            "usage": _usage(stats),
            # semjobs extension: the parsed answer and the decoding stats of this item.
            "semjobs": {"final_answer": out.final_answer, "method": job.config.get("method"),
                        "stats": _stats(stats)},
        }
        if steps is not None:
            body["semjobs"]["steps"] = steps
        return {
            "id": f"batch_req_{job.id}_{item.seq}",
            "custom_id": req["id"],
            "response": {"status_code": 200, "request_id": f"{job.id}-{item.seq}", "body": body},
            "error": None,
        }
    line = {
        "id": req["id"],
        "output": out.text,
        "final_answer": out.final_answer,
        "finish_reason": out.finish_reason,
        "usage": _usage(stats),
        "method": job.config.get("method"),
        "stats": _stats(stats),
        "models": out.models,
    }
    if req.get("meta"):
        line["meta"] = req["meta"]
    if steps is not None:
        line["steps"] = steps
    return line


def error_line(job: Job, item: Item) -> dict:
    message = item.error or ("cancelled" if item.status == "cancelled" else "failed")
    if job.input_format == OPENAI_BATCH:
        return {
            "id": f"batch_req_{job.id}_{item.seq}",
            "custom_id": item.request["id"],
            "response": None,
            "error": {"code": item.status, "message": message},
        }
    return {"id": item.request["id"], "status": item.status, "error": message,
            "attempts": item.attempts, "line": item.line}


def iter_lines(job_id: str, *, url: str | None = None, with_steps: bool = False
               ) -> Iterator[tuple[str, dict]]:
    """("result" | "error" | "unfinished", line) in input order."""
    with session_factory(url)() as session:
        job = repo.get_job(session, job_id)
        if job is None:
            raise KeyError(job_id)
        steps_session = session_factory(url)() if with_steps else None
        try:
            for item, out, stats in repo.iter_export(session, job_id):
                if item.status == "done" and out is not None:
                    steps = _steps(steps_session, item) if with_steps else None
                    yield "result", result_line(job, item, out, stats, steps)
                elif item.status in ("failed", "cancelled"):
                    yield "error", error_line(job, item)
                else:
                    yield "unfinished", {"id": item.request["id"], "status": item.status}
        finally:
            if steps_session is not None:
                steps_session.close()


class _ParquetSink:
    def __init__(self, path: Path, batch: int = 2000):
        import pyarrow  # noqa: F401  (fail early when missing)

        self.path, self.batch, self.rows, self.writer = path, batch, [], None

    def write(self, line: dict) -> None:
        self.rows.append({k: (json.dumps(v, ensure_ascii=False) if isinstance(v, (dict, list)) else v)
                          for k, v in line.items()})
        if len(self.rows) >= self.batch:
            self.flush()

    def flush(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not self.rows:
            return
        keys = list(dict.fromkeys(k for r in self.rows for k in r))
        table = pa.Table.from_pylist([{k: r.get(k) for k in keys} for r in self.rows])
        if self.writer is None:
            self.writer = pq.ParquetWriter(str(self.path), table.schema)
        self.writer.write_table(table.cast(self.writer.schema))
        self.rows = []

    def close(self) -> None:
        self.flush()
        if self.writer is not None:
            self.writer.close()


class _JsonlSink:
    def __init__(self, path: Path):
        self.f = open(path, "w", encoding="utf-8")

    def write(self, line: dict) -> None:
        self.f.write(json.dumps(line, ensure_ascii=False) + "\n")

    def close(self) -> None:
        self.f.close()


def _sink(path: Path):
    return _ParquetSink(path) if path.suffix == ".parquet" else _JsonlSink(path)


def _sibling(out: Path, suffix: str) -> Path:
    stem = out.name[: -len(out.suffix)] if out.suffix else out.name
    return out.with_name(f"{stem}{suffix}")


def default_errors_path(out: Path) -> Path:
    return _sibling(out, ".errors.jsonl")


def write_manifest(job_id: str, path: Path, *, url: str | None = None) -> None:
    """Reproducibility manifest beside the export: input file hash, models and their
    identities (path + sha256, probes included), the generation config, counts, timings."""
    from jobs.status import job_status

    st = job_status(job_id, url=url)
    manifest = {
        "job": {k: st[k] for k in ("id", "name", "status", "method", "input_format", "queue",
                                   "n_items", "created_at", "started_at", "finished_at")},
        "config": st["config"],
        **st["manifest"],
        "counts": st["counts"],
        "totals": {k: st[k] for k in ("generated_tokens", "prompt_tokens", "elapsed_s",
                                      "tokens_per_s", "decode_tokens_per_s")},
        "acceptance": st["acceptance"],
    }
    path.write_text(json.dumps(manifest, indent=2, default=str) + "\n")


def export_job(job_id: str, out: str | Path, errors: str | Path | None = None, *,
               url: str | None = None, with_steps: bool = False,
               manifest: bool = True) -> ExportReport:
    """Write results to `out` and failed/cancelled items to `errors` (default: beside `out`,
    created only when there are any), and OUT's name + .manifest.json."""
    out = Path(out)
    errors_path = Path(errors) if errors else None
    report = ExportReport(out=out)
    sink = _sink(out)
    err_f = open(errors_path, "w", encoding="utf-8") if errors_path else None
    try:
        for kind, line in iter_lines(job_id, url=url, with_steps=with_steps):
            if kind == "result":
                sink.write(line)
                report.results += 1
            elif kind == "error":
                if err_f is None:
                    errors_path = default_errors_path(out)
                    err_f = open(errors_path, "w", encoding="utf-8")
                err_f.write(json.dumps(line, ensure_ascii=False) + "\n")
                report.errors += 1
            else:
                report.unfinished += 1
    finally:
        sink.close()
        if err_f is not None:
            err_f.close()
    report.errors_path = errors_path
    if manifest:
        report.manifest_path = _sibling(out, ".manifest.json")
        write_manifest(job_id, report.manifest_path, url=url)
    return report
