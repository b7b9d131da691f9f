"""Export: one row per finished sample keyed by the input's id and the sample's index;
failed and cancelled samples go to an errors file. Formats: JSONL, Parquet (nested fields as
JSON text; loads with `datasets.load_dataset("parquet", ...)`), the OpenAI Batch output
shape (one line per input, its samples as `choices`; the default for jobs submitted as
Batch lines) and a Hugging Face dataset directory (`datasets.load_from_disk`) with a dataset
card made from the job's manifest. `--only correct|incorrect` and `--majority` filter the
samples (rejection sampling, self-consistency).

Every file lands whole or not at all (`Staged`), an existing one is replaced only with
`force`, and the job's input file never (`check_targets`)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from semjobs.db import repo
from semjobs.db.models import Item, ItemStats, Job, Output
from semjobs.db.session import session_factory
from semjobs.jobs import accuracy
from semjobs.jobs.export_fields import EXPORT_FIELDS, FORMATS, ONLY, OPTIONAL_FIELDS
from semjobs.jobs.locate import sqlite_file
from semjobs.jobs.schema import OPENAI_BATCH
from semjobs.settings import settings

MANIFEST_SUFFIX = ".manifest.json"
ERRORS_SUFFIX = ".errors.jsonl"


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
        # a loop cut (repetition) or a doomed sample did not end by itself: not "stop"; semjobs.finish_reason says which
        "finish_reason": "stop" if out.finish_reason == "eos" else "length",
        # semjobs extension: this sample's parsed answer and its check
        "semjobs": {"final_answer": out.final_answer, "correct": out.correct, "kept": out.kept,
                    "finish_reason": out.finish_reason},
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
        "kept": out.kept,
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
    if only == "kept":
        done = [k for k in done if k.out.kept]
    elif only is not None:
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
    # samples an input no longer needed (--want) or the budget left undecoded are finished too
    settled = sum(item.status in ("unneeded", "over_budget") for item, _, _ in group)
    unfinished = len(group) - len(done) - len(errors) - settled
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


# OUT's companion files are named after OUT's whole name, so that two formats of one job
# (out.jsonl, out.parquet) keep theirs side by side
def default_errors_path(out: Path) -> Path:
    return out.with_name(out.name + ERRORS_SUFFIX)


def manifest_path(out: Path) -> Path:
    return out.with_name(out.name + MANIFEST_SUFFIX)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_staged(path: Path) -> None:
    """Flush a staged file, or every file of a staged directory, to disk before its rename,
    so a crash cannot leave a complete-looking name over missing data."""
    if path.is_dir():
        for folder, _, names in os.walk(path):
            for name in names:
                _fsync(Path(folder, name))
    _fsync(path)


class Staged:
    """Files and directories written under temporary names beside their final paths, moved
    into place together when the `with` block ends without an error, removed when it fails:
    a failed export leaves no truncated file that looks complete. The rename replaces a
    symlink at the final path itself, so nothing is ever written where a link points."""

    def __init__(self, replace: bool = True) -> None:
        self._moves: list[tuple[Path, Path]] = []  # (temporary, final)
        self._stale: list[Path] = []
        # False: a final path that appeared since the caller checked it is not replaced (the
        # commit fails, and what it had moved is taken back)
        self._replace = replace

    @staticmethod
    def _temporary(final: Path) -> Path:
        # hidden, and ending in the final name, so writers that go by the suffix (savefig) agree
        return final.with_name(f".tmp-{secrets.token_hex(4)}-{final.name}")

    def file(self, final: Path) -> Path:
        """A new empty file to write FINAL's content into."""
        tmp = self._temporary(final)
        # O_EXCL: never opens through a link planted at the name; 0o666 less the umask, as open()
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        self._moves.append((tmp, final))
        return tmp

    def directory(self, final: Path) -> Path:
        """A new empty directory to write FINAL's content into."""
        tmp = self._temporary(final)
        tmp.mkdir()
        self._moves.append((tmp, final))
        return tmp

    def remove(self, stale: Path) -> None:
        """Delete STALE (an earlier export's file this one does not rewrite) on success."""
        self._stale.append(stale)

    def __enter__(self) -> "Staged":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self._discard()
            return
        try:
            self._commit()
        except BaseException:
            self._discard()
            raise

    def _commit(self) -> None:
        for tmp, _ in self._moves:
            _fsync_staged(tmp)
        placed: list[Path] = []
        for tmp, final in self._moves:
            if self._replace:
                if tmp.is_dir() and (final.is_symlink() or final.is_file()):
                    final.unlink()  # a directory is renamed only onto nothing or an empty directory
                os.replace(tmp, final)
                continue
            try:  # a link, and a rename of a directory, fail where something is there now
                if tmp.is_dir():
                    os.rename(tmp, final)
                else:
                    os.link(tmp, final)
                    tmp.unlink()
            except OSError as e:
                for done in placed:  # ours alone: nothing else was replaced
                    if done.is_dir():
                        shutil.rmtree(done)
                    else:
                        done.unlink()
                raise ValueError(f"{final} appeared during the export: give --force to replace it") from e
            placed.append(final)
        for stale in self._stale:
            stale.unlink(missing_ok=True)
        for parent in {final.parent for _, final in self._moves}:
            _fsync(parent)  # the renames themselves

    def _discard(self) -> None:
        for tmp, _ in self._moves:
            if tmp.is_dir():
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                tmp.unlink(missing_ok=True)


def _same_file(path: Path, other: Path) -> bool:
    return path.exists() and other.exists() and os.path.samefile(path, other)


def check_targets(out: str | Path, errors: str | Path | None = None, *, force: bool = False,
                  manifest: bool = True, directory: bool = False,
                  input_path: str | Path | None = None, url: str | None = None) -> None:
    """Refuse, before anything is written, an export to OUT (a directory when ``directory``)
    that would replace an existing file without ``force``, the job's input file or its
    SQLite database (``url``; the settings' when None) at all, or that names one file twice:
    OUT, its errors file (an earlier one is removed when this export has no errors) and its
    manifest."""
    out = Path(out)
    files = [Path(errors) if errors else default_errors_path(out)]
    if manifest:
        files.append(manifest_path(out))
    if directory:
        _check_directory_target(out, force)
    else:
        files.insert(0, out)
    named = [os.path.abspath(path) for path in files]
    if len(set(named)) < len(named):
        twice = next(path for path in files if named.count(os.path.abspath(path)) > 1)
        raise ValueError(f"{twice} is named for two of the export's files (output, errors, manifest): "
                         "give each its own path")
    protected = {"the job's input file": input_path, "the job database": sqlite_file(url or settings.database_url)}
    for path in files:
        for what, mine in protected.items():
            if mine is not None and _same_file(path, Path(mine)):
                raise ValueError(f"{path} is {what}: an export never replaces it, not even with --force; "
                                 "choose another path")
        if os.path.lexists(path) and not force:
            raise ValueError(f"{path} exists: give --force to replace it")


def _check_directory_target(out: Path, force: bool) -> None:
    if not os.path.lexists(out):
        return
    if out.is_symlink() or not out.is_dir():
        if not force:
            raise ValueError(f"{out} exists: give --force to replace it")
    elif any(out.iterdir()):  # an empty directory is replaced as if it were not there
        raise ValueError(f"{out} exists and is not an empty directory (--force does not delete "
                         "directories: remove it first)")


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
        "yield": st["yield"],
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


def _write_hf(parquet: Path, rows: int, out: Path, card: str, staged: Staged) -> None:
    import datasets

    if not rows:  # datasets (5.2) can save a dataset without rows but not load it back
        raise ValueError(f"no sample to export (after the filters): {out} was not written")
    # the Arrow copy datasets makes goes beside the Parquet file (a temporary directory), not
    # into the user's Hugging Face cache
    ds = datasets.Dataset.from_parquet(str(parquet), cache_dir=str(parquet.parent / "cache"))
    directory = staged.directory(out)
    ds.save_to_disk(str(directory))
    (directory / "README.md").write_text(card, encoding="utf-8")


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
               fmt: str | None = None, only: str | None = None, majority: bool = False,
               force: bool = False) -> ExportReport:
    """Write the job's finished samples to `out` in `fmt` (default: from `out` and the job),
    failed/cancelled ones to `errors` (default: beside `out`, created only when there are
    any), and OUT's name + .manifest.json (``manifest_path``). `only` ("correct" | "incorrect") and `majority`
    filter the samples; asking for them on a job without references is an error. Existing
    files are replaced only with `force` (check_targets), each whole once all are written."""
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
    check_targets(out, errors, force=force, manifest=manifest, directory=fmt == "hf",
                  input_path=meta.get("input", {}).get("path"), url=url)
    report = ExportReport(out=out, errors_path=Path(errors) if errors else None)
    errors_target = report.errors_path or default_errors_path(out)
    for path in (out, report.errors_path):
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
    # the ExitStack closes the files before Staged moves them into place
    with Staged(replace=force) as staged, contextlib.ExitStack() as stack:
        if fmt == "hf":
            rows_path = Path(stack.enter_context(tempfile.TemporaryDirectory())) / "rows.parquet"
            sink = _ParquetSink(rows_path)
        else:
            sink = _ParquetSink(staged.file(out)) if fmt == "parquet" else _JsonlSink(staged.file(out))
        stack.callback(sink.close)
        err_f = None
        if report.errors_path is not None:
            err_f = stack.enter_context(open(staged.file(errors_target), "w", encoding="utf-8"))
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
                    report.errors_path = errors_target
                    err_f = stack.enter_context(open(staged.file(errors_target), "w", encoding="utf-8"))
                err_f.write(json.dumps(error_line(job_row, item, fmt == "batch"), ensure_ascii=False) + "\n")
                report.errors += 1
            report.unfinished += unfinished
        sink.close()
        if report.errors_path is None:
            staged.remove(errors_target)  # an earlier export's errors there would belong to this one
        if fmt == "hf":
            _write_hf(rows_path, report.results, out, dataset_card(meta, report.results, only, majority), staged)
        if manifest:
            report.manifest_path = manifest_path(out)
            staged.file(report.manifest_path).write_text(json.dumps(meta, indent=2, default=str) + "\n")
    return report
