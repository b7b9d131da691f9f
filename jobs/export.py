"""Export: one row per finished sample keyed by the input's id and the sample's index;
failed and cancelled samples go to an errors file. Formats: JSONL, Parquet (nested fields as
JSON text; loads with `datasets.load_dataset("parquet", ...)`), the OpenAI Batch output
shape (one line per input, its samples as `choices`; the default for jobs submitted as
Batch lines) and a Hugging Face dataset directory (`datasets.load_from_disk`) with a dataset
card made from the job's manifest. `--only correct|incorrect` and `--majority` filter the
samples (rejection sampling, self-consistency)."""

from __future__ import annotations

import contextlib
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from semjobs.db import repo
from semjobs.db.models import Item, ItemStats, Job, Output
from semjobs.db.session import session_factory
from semjobs.jobs import accuracy
from semjobs.jobs.export_fields import EXPORT_FIELDS, FORMATS, ONLY, OPTIONAL_FIELDS
from semjobs.jobs.schema import OPENAI_BATCH



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


@dataclass
class Kept:
    """A finished sample the export writes."""

    item: Item
    out: Output
    stats: ItemStats | None
    steps: list[dict] | None = None


def _choice(item: Item, out: Output) -> dict:
    return {
        "index": item.sample,
        "message": {"role": "assistant", "content": out.text},
        "finish_reason": "length" if out.finish_reason == "length" else "stop",
        # semjobs extension: this sample's parsed answer and its check
        "semjobs": {"final_answer": out.final_answer, "correct": out.correct},
    }


def batch_line(job: Job, done: list[Kept]) -> dict:
    """One OpenAI Batch output line for an input: its finished samples as `choices`."""
    first = done[0]
    req, stats = first.item.request, [k.stats for k in done]
    created = max((int(k.out.created_at.timestamp()) for k in done if k.out.created_at), default=0)
    usage = {"prompt_tokens": first.stats.prompt_tokens if first.stats else 0,
             "completion_tokens": sum(st.generated_tokens for st in stats if st)}
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    body = {
        "id": f"chatcmpl-{job.id}-{first.item.seq}",
        "object": "chat.completion",
        "created": created,
        "model": (first.out.models or {}).get("target") or req.get("meta", {}).get("model") or "semjobs",
        "choices": [_choice(k.item, k.out) for k in done],
        "usage": usage,
        # semjobs extension: the decoding stats of each sample
        "semjobs": {"method": job.config.get("method"), "stats": [_stats(st) for st in stats]},
    }
    if any(k.steps is not None for k in done):
        body["semjobs"]["steps"] = [k.steps for k in done]
    return {
        "id": f"batch_req_{job.id}_{first.item.seq}",
        "custom_id": str(req["id"]),
        "response": {"status_code": 200, "request_id": f"{job.id}-{first.item.seq}", "body": body},
        "error": None,
    }


def result_line(job: Job, kept: Kept) -> dict:
    """One sample's row (JSONL, Parquet and the Hugging Face dataset): EXPORT_FIELDS in order,
    then the input's own extra fields (`meta`) and the step log when asked for."""
    item, out, stats, req = kept.item, kept.out, kept.stats, kept.item.request
    values = {
        "id": req["id"],
        "sample": item.sample,
        "output": out.text,
        # rows stored before these columns existed: the whole output is the reasoning
        "reasoning": out.reasoning if out.reasoning is not None else out.text,
        "content": out.content if out.content is not None else "",
        "final_answer": out.final_answer,
        "reference": req.get("reference"),
        "correct": out.correct,
        "finish_reason": out.finish_reason,
        "usage": _usage(stats),
        "method": job.config.get("method"),
        "stats": _stats(stats),
        "models": out.models,
    }
    line = {k: values[k] for k in EXPORT_FIELDS}
    if req.get("meta"):
        line["meta"] = req["meta"]
    if kept.steps is not None:
        line["steps"] = kept.steps
    return line


def error_line(job: Job, item: Item, batch: bool) -> dict:
    message = item.error or ("cancelled" if item.status == "cancelled" else "failed")
    if batch:
        return {
            "id": f"batch_req_{job.id}_{item.seq}",
            "custom_id": str(item.request["id"]),
            "response": None,
            "error": {"code": item.status, "message": message, "sample": item.sample},
        }
    return {"id": item.request["id"], "sample": item.sample, "status": item.status, "error": message,
            "attempts": item.attempts, "line": item.line}


def _select(done: list[Kept], only: str | None, majority: bool) -> list[Kept]:
    """An input's finished samples after the filters: its majority answer's first sample,
    then those right (or wrong) by its reference."""
    if majority:
        pick = accuracy.majority([accuracy.Answer(str(k.item.item_id), k.item.sample, k.out.final_answer,
                                                  k.out.correct) for k in done])
        done = [k for k in done if pick is not None and k.item.sample == pick.sample]
    if only is not None:
        done = [k for k in done if k.out.correct is (only == "correct")]
    return done


def iter_inputs(job_id: str, *, url: str | None = None, with_steps: bool = False,
                only: str | None = None, majority: bool = False
                ) -> Iterator[tuple[Job, list[Kept], list[Item], int]]:
    """Per input, in input order: (job, its finished samples kept by the filters, its
    failed and cancelled samples, how many are not finished yet)."""
    with session_factory(url)() as session:
        job = repo.get_job(session, job_id)
        if job is None:
            raise KeyError(job_id)
        steps_session = session_factory(url)() if with_steps else None
        try:
            group: list[tuple] = []
            for row in repo.iter_export(session, job_id):
                if group and row[0].item_id != group[0][0].item_id:
                    yield job, *_settle(group, steps_session, only, majority)
                    group = []
                group.append(row)
            if group:
                yield job, *_settle(group, steps_session, only, majority)
        finally:
            if steps_session is not None:
                steps_session.close()


def _settle(group: list[tuple], steps_session, only, majority) -> tuple[list[Kept], list[Item], int]:
    done = [Kept(item, out, stats) for item, out, stats in group if item.status == "done" and out is not None]
    errors = [item for item, _, _ in group if item.status in ("failed", "cancelled")]
    unfinished = len(group) - len(done) - len(errors)
    done = _select(done, only, majority)
    if steps_session is not None:
        for k in done:
            k.steps = _steps(steps_session, k.item)
    return done, errors, unfinished


def _parquet_schema():
    import pyarrow as pa

    types = {"string": pa.string(), "int64": pa.int64(), "bool": pa.bool_()}
    return pa.schema([(name, types[kind]) for name, (kind, _) in {**EXPORT_FIELDS, **OPTIONAL_FIELDS}.items()])


def _column_value(value: Any) -> Any:
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    return value


class _ParquetSink:
    """Rows in batches under one fixed schema, so a column that is null in the first batch (no
    references yet) or a field only later rows have (`meta`) cannot break a later batch."""

    def __init__(self, path: Path, batch: int = 2000):
        import pyarrow.parquet as pq

        self.path, self.batch, self.rows = path, batch, []
        self.schema = _parquet_schema()
        self.writer = pq.ParquetWriter(str(path), self.schema)

    def write(self, line: dict) -> None:
        row = {k: _column_value(line.get(k)) for k in self.schema.names}
        row["id"] = str(row["id"])
        self.rows.append(row)
        if len(self.rows) >= self.batch:
            self.flush()

    def flush(self) -> None:
        import pyarrow as pa

        rows, self.rows = self.rows, []  # taken first: a failed write is not retried on close
        if rows:
            self.writer.write_table(pa.Table.from_pylist(rows, schema=self.schema))

    def close(self) -> None:
        if self.writer.is_open:
            self.flush()
            self.writer.close()


class _JsonlSink:
    def __init__(self, path: Path):
        self.f = open(path, "w", encoding="utf-8")

    def write(self, line: dict) -> None:
        self.f.write(json.dumps(line, ensure_ascii=False) + "\n")

    def close(self) -> None:
        self.f.close()


def _sibling(out: Path, suffix: str) -> Path:
    stem = out.name[: -len(out.suffix)] if out.suffix else out.name
    return out.with_name(f"{stem}{suffix}")


def default_errors_path(out: Path) -> Path:
    return _sibling(out, ".errors.jsonl")


def manifest_of(job_id: str, *, url: str | None = None) -> dict:
    """Reproducibility manifest: input file hash, models and their identities (path +
    sha256, probes included), the generation config, counts, timings, answers."""
    from semjobs.jobs.status import job_status

    st = job_status(job_id, url=url)
    return {
        "job": {k: st[k] for k in ("id", "name", "status", "method", "input_format", "queue",
                                   "n_items", "created_at", "started_at", "finished_at")},
        "config": st["config"],
        **st["manifest"],
        "counts": st["counts"],
        "totals": {k: st[k] for k in ("generated_tokens", "prompt_tokens", "elapsed_s",
                                      "tokens_per_s", "decode_tokens_per_s")},
        "acceptance": st["acceptance"],
        "answers": st["answers"],
    }


def dataset_card(manifest: dict, rows: int, only: str | None, majority: bool) -> str:
    """README.md of an exported dataset: what made it, with which settings, how right it is."""
    job, cfg, counts = manifest["job"], manifest["config"], manifest["counts"]
    ids = manifest.get("identities") or manifest.get("models") or {}
    filters = [f for f in (f"only {only}" if only else None, "majority vote" if majority else None) if f]
    lines = [
        f"# {job['name'] or job['id']}", "",
        f"Generated by semjobs {manifest.get('semjobs_version', '')} (job `{job['id']}`, "
        f"method `{job['method']}`): {rows} rows, one per kept sample"
        + (f" ({', '.join(filters)})" if filters else "") + ".", "",
        "## Models", "",
        *[f"- {role}: `{ident}`" for role, ident in ids.items()], "",
        "## Settings", "",
        *[f"- {k}: `{v}`" for k, v in cfg.items()],
        f"- samples per input: {manifest.get('samples_per_input', 1)}",
        f"- input: `{manifest['input']['path']}` (sha256 `{manifest['input']['sha256']}`)", "",
        "## Counts", "",
        *[f"- {k}: {v}" for k, v in counts.items()],
    ]
    ans = manifest.get("answers")
    if ans:
        lines += ["", "## Answers (checked against the inputs' references)", "",
                  f"- accuracy: {ans['accuracy']} over {ans['samples_checked']} samples of {ans['inputs']} inputs",
                  *[f"- pass@{k}: {v}" for k, v in ans["pass_at_k"].items()],
                  f"- majority-vote accuracy: {ans['majority_accuracy']}"]
    lines += ["", "Columns: see the semjobs README (Output). Nested fields (usage, stats, models, meta, "
              "steps) are JSON text.", ""]
    return "\n".join(lines)


def _write_hf(parquet: Path, rows: int, out: Path, card: str) -> None:
    import datasets

    if not rows:  # datasets (5.2) can save a dataset without rows but not load it back
        raise ValueError(f"no sample to export (after the filters): {out} was not written")
    # the Arrow copy datasets makes goes beside the Parquet file (a temporary directory), not
    # into the user's Hugging Face cache
    ds = datasets.Dataset.from_parquet(str(parquet), cache_dir=str(parquet.parent / "cache"))
    ds.save_to_disk(str(out))
    (out / "README.md").write_text(card, encoding="utf-8")


def resolve_format(fmt: str | None, out: Path, job: Job) -> str:
    """The export format: as asked, else from OUT's suffix, else the job's input shape."""
    if fmt is not None:
        if fmt not in FORMATS:
            raise ValueError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")
        return fmt
    if out.suffix == ".parquet":
        return "parquet"
    return "batch" if job.input_format == OPENAI_BATCH else "jsonl"


def export_job(job_id: str, out: str | Path, errors: str | Path | None = None, *,
               url: str | None = None, with_steps: bool = False, manifest: bool = True,
               fmt: str | None = None, only: str | None = None, majority: bool = False) -> ExportReport:
    """Write the job's finished samples to `out` in `fmt` (default: from `out` and the job),
    failed/cancelled ones to `errors` (default: beside `out`, created only when there are
    any), and OUT's name + .manifest.json. `only` ("correct" | "incorrect") and `majority`
    filter the samples; asking for them on a job without references is an error."""
    out = Path(out)
    with session_factory(url)() as session:
        job = repo.get_job(session, job_id)
        if job is None:
            raise KeyError(job_id)
        fmt = resolve_format(fmt, out, job)
    if only is not None and only not in ONLY:
        raise ValueError(f"--only takes {' or '.join(ONLY)}, not {only!r}")
    meta = manifest_of(job_id, url=url)
    if only is not None and meta["answers"] is None:
        raise ValueError("no output of this job was checked against a reference (its inputs carry "
                         "no `answer`), so none is correct or incorrect")
    report = ExportReport(out=out, errors_path=Path(errors) if errors else None)
    for path in (out, report.errors_path):
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        if fmt == "hf":
            if out.exists() and (not out.is_dir() or any(out.iterdir())):
                raise ValueError(f"{out} exists and is not an empty directory")
            rows_path = Path(stack.enter_context(tempfile.TemporaryDirectory())) / "rows.parquet"
            sink = _ParquetSink(rows_path)
        else:
            sink = _ParquetSink(out) if fmt == "parquet" else _JsonlSink(out)
        stack.callback(sink.close)
        err_f = None
        if report.errors_path is not None:
            err_f = stack.enter_context(open(report.errors_path, "w", encoding="utf-8"))
        for job_row, kept, failed, unfinished in iter_inputs(job_id, url=url, with_steps=with_steps,
                                                             only=only, majority=majority):
            if fmt == "batch" and kept:
                sink.write(batch_line(job_row, kept))
            elif fmt != "batch":
                for k in kept:
                    sink.write(result_line(job_row, k))
            report.results += len(kept)
            for item in failed:
                if err_f is None:  # created only when there is something to put in it
                    report.errors_path = default_errors_path(out)
                    err_f = stack.enter_context(open(report.errors_path, "w", encoding="utf-8"))
                err_f.write(json.dumps(error_line(job_row, item, fmt == "batch"), ensure_ascii=False) + "\n")
                report.errors += 1
            report.unfinished += unfinished
        sink.close()
        if fmt == "hf":
            _write_hf(rows_path, report.results, out, dataset_card(meta, report.results, only, majority))
    if manifest:
        report.manifest_path = _sibling(out, ".manifest.json")
        report.manifest_path.write_text(json.dumps(meta, indent=2, default=str) + "\n")
    return report
