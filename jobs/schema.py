"""Input records: plain `{"id", "prompt" | "messages"}` lines and OpenAI Batch lines.

`iter_records(path)` streams a JSONL file and yields one `Record` per non-blank line, or an
`InputError` (line number, field, message) for each problem found. `validate_file` runs the
whole file through it before anything is stored, keeping only the ids (for the duplicate
check) and a running sha256 in memory.

Whatever a line holds that would be stored is checked against what its column takes (lengths
from `semjobs.db.models`, text without NUL or lone surrogates, finite numbers), so that a bad
line is refused here, with its line and field, and never fails the insert of a whole job.
"""

from __future__ import annotations

import codecs
import functools
import hashlib
import json
import math
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

PLAIN = "plain"
OPENAI_BATCH = "openai_batch"
BATCH_URLS = ("/v1/chat/completions",)
ROLES = ("system", "developer", "user", "assistant")
# Per-item decoding parameters a line may carry; they override the job's settings.
PARAM_TYPES = {"max_new_tokens": int, "temperature": float, "top_p": float, "seed": int}
MAX_SAMPLES = 64  # samples per input (`n`): more is many jobs' worth of one prompt
# Seeds reach torch's generator (vLLM seeds a request's own; it takes 0 to 2^64 - 1, and vLLM
# reads -1 as "no seed"); kept to signed 64 bits so that every reader of the stored request
# (a BIGINT, pandas, JSON readers of int64) reads the same number back.
MAX_SEED = 2**63 - 1
# Token counts are stored in INTEGER (32-bit) columns (item_stats); the engines cap
# max_new_tokens at the context anyway.
MAX_TOKENS = 2**31 - 1
# Levels of nested objects and lists in a line: messages with content parts need 6; deeper
# is no metadata but a way to make every reader of the stored request recurse.
MAX_DEPTH = 32
# Fields of a plain line that ask for something rather than being kept as its metadata.
CONTROL_FIELDS = ("id", "prompt", "messages", "n", "want", "chat_template_kwargs", *PARAM_TYPES)
MAX_REPORTED_ERRORS = 50
# A Batch line asks for a request: a field it names that semjobs would not honour (`stop`,
# `logprobs`, `tools`, ...) is refused rather than silently dropped.
BATCH_LINE_FIELDS = ("custom_id", "method", "url", "body", "metadata")
BATCH_BODY_FIELDS = ("messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed",
                     "n", "chat_template_kwargs", "metadata", "model", "user", "store", "stream")


@dataclass
class InputError:
    line: int
    field: str | None
    message: str

    def __str__(self) -> str:
        where = f"line {self.line}" if self.line else "file"
        if self.field:
            where += f", field '{self.field}'"
        return f"{where}: {self.message}"


@dataclass
class Record:
    line: int
    format: str
    id: str | int  # the input's id exactly as given (custom_id for batch lines)
    prompt: str | None = None
    messages: list[dict[str, str]] | None = None
    params: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    n: int | None = None  # samples asked for by the line itself (else the job's)
    want: int | None = None  # kept samples that are enough, by the line itself (else the job's)
    reference: str | None = None  # the answer to check outputs against, when the line has one
    chat_template_kwargs: dict[str, Any] | None = None
    size: int = 0  # the line's bytes, which each of its samples stores again

    @property
    def key(self) -> str:
        return str(self.id)

    def samples(self, default: int) -> int:
        return self.n if self.n is not None else default

    def field_name(self, part: str) -> str:
        """The line's own name for ``part`` ("prompt": its prompt or messages, "n",
        "chat_template_kwargs"): a Batch line holds them in its body."""
        if part == "prompt" and self.prompt is None:
            part = "messages"
        return f"body.{part}" if self.format == OPENAI_BATCH else part

    def request(self) -> dict[str, Any]:
        """The normalised request stored in items.request (the same for each sample)."""
        req: dict[str, Any] = {"id": self.id}
        if self.prompt is not None:
            req["prompt"] = self.prompt
        else:
            req["messages"] = self.messages
        if self.params:
            req["params"] = self.params
        if self.chat_template_kwargs:
            req["chat_template_kwargs"] = self.chat_template_kwargs
        if self.want is not None:
            req["want"] = self.want
        if self.reference is not None:
            req["reference"] = self.reference
        if self.meta:
            req["meta"] = self.meta
        return req


@dataclass
class Validation:
    path: Path
    format: str | None
    n_items: int  # inputs
    sha256: str
    errors: list[InputError]
    n_errors: int
    n_samples: int = 0  # items to store: every input's samples
    n_wanting: int = 0  # lines that say how many kept samples are enough (`want`)
    context_unchecked: str | None = None  # why prompt lengths could not be checked, if so

    @property
    def ok(self) -> bool:
        return self.n_errors == 0 and self.n_items > 0


class _Bad(Exception):
    def __init__(self, field: str | None, message: str):
        self.field, self.message = field, message


@functools.cache
def column_chars(model: str, column: str) -> int:
    """The length of a VARCHAR column of ``semjobs.db.models`` (read there, not copied here;
    imported on first use, as the CLI imports this module for every command)."""
    from semjobs.db import models

    return getattr(models, model).__table__.c[column].type.length


def text_problem(text: str) -> str | None:
    """Why ``text`` cannot be stored as text, or None: Postgres refuses NUL in text (and in
    JSON read back as text), and a lone surrogate (JSON's "\\ud800") is no UTF-8 at all."""
    if "\x00" in text:
        return "holds U+0000 (NUL), which the database cannot store as text"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"holds a lone surrogate (U+{ord(text[e.start]):04X}), which is not valid Unicode text"
    return None


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a job's name (the jobs.name column), or None."""
    limit = column_chars("Job", "name")
    if len(name) > limit:
        return f"longer than {limit} characters"
    return text_problem(name)


def _check_storable(value: Any, depth: int = 0) -> None:
    """Refuse the first value of a parsed line that the database would refuse or could not
    read back: text with NUL or lone surrogates (values and keys), NaN and Infinity (Python
    reads them, Postgres' JSON does not), nesting deeper than MAX_DEPTH. The field's name is
    put together on the way out, so that a good line pays for none."""
    if isinstance(value, str):
        problem = text_problem(value)
        if problem:
            raise _Bad("", problem)
    elif isinstance(value, float) and not math.isfinite(value):
        raise _Bad("", f"{value} is not a number JSON can store")
    elif isinstance(value, (dict, list)):
        if depth >= MAX_DEPTH:
            raise _Bad("", f"nested deeper than {MAX_DEPTH} levels")
        for key, child in value.items() if isinstance(value, dict) else enumerate(value):
            try:
                problem = text_problem(key) if isinstance(key, str) else None
                if problem:
                    raise _Bad("", f"the key {problem}")
                _check_storable(child, depth + 1)
            except _Bad as e:
                e.field = _field_path(key, e.field)
                raise


def _field_path(key: str | int, inner: str) -> str:
    """``inner`` (a field's name within the value at ``key``) named from the parent: "k.inner",
    "k[1]"."""
    if isinstance(key, int):
        outer = f"[{key}]"
    else:  # a key that cannot be printed (or stored) is named by repr's escapes
        outer = key if text_problem(key) is None else repr(key)[1:-1]
    return outer + (inner if not inner or inner.startswith("[") else "." + inner)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return (_is_int(v) or isinstance(v, float)) and math.isfinite(v)


def _check_id(value: Any, name: str) -> str | int:
    if value is None:
        raise _Bad(name, "missing")
    if not _is_int(value) and not isinstance(value, str):
        raise _Bad(name, f"must be a string or an integer, got {type(value).__name__}")
    if isinstance(value, str) and not value.strip():
        raise _Bad(name, "must not be empty")
    limit = column_chars("Item", "item_id")  # stored as text: an integer by its digits
    if len(str(value)) > limit:
        raise _Bad(name, f"longer than {limit} characters")
    return value


def _check_messages(value: Any, name: str) -> list[dict[str, str]]:
    if not isinstance(value, list):
        raise _Bad(name, f"must be a list of messages, got {type(value).__name__}")
    if not value:
        raise _Bad(name, "must not be empty")
    out = []
    for i, msg in enumerate(value):
        where = f"{name}[{i}]"
        if not isinstance(msg, dict):
            raise _Bad(where, f"must be an object, got {type(msg).__name__}")
        role = msg.get("role")
        if not isinstance(role, str):
            raise _Bad(f"{where}.role", "missing or not a string")
        if role not in ROLES:
            raise _Bad(f"{where}.role", f"must be one of {', '.join(ROLES)}, got {role!r}")
        content = msg.get("content")
        if isinstance(content, list):  # OpenAI content parts: keep the text parts
            texts = []
            for j, part in enumerate(content):
                if not (isinstance(part, dict) and part.get("type") == "text"):
                    raise _Bad(f"{where}.content[{j}]", "only text parts are supported")
                if not isinstance(part.get("text"), str):
                    raise _Bad(f"{where}.content[{j}].text", "missing or not a string")
                texts.append(part["text"])
            content = "".join(texts)
        if not isinstance(content, str):
            raise _Bad(f"{where}.content", "missing or not a string")
        out.append({"role": role, "content": content})
    if not any(m["content"].strip() for m in out if m["role"] != "assistant"):
        raise _Bad(name, "no non-empty system/user message")
    return out


def _check_param(obj: dict, key: str, name: str, kind: type) -> Any:
    value = obj[key]
    if kind is int:
        if not _is_int(value):
            raise _Bad(name, f"must be an integer, got {type(value).__name__}")
        low, high = (0, MAX_SEED) if key == "seed" else (1, MAX_TOKENS)
        if value < low:
            raise _Bad(name, "must not be negative" if key == "seed" else "must be positive")
        if value > high:
            raise _Bad(name, f"must be at most {high}")
        return value
    if not _is_number(value):
        raise _Bad(name, f"must be a number, got {type(value).__name__}")
    if key == "temperature" and not 0 <= value <= 2:
        raise _Bad(name, "must be between 0 and 2")
    if key == "top_p" and not 0 < value <= 1:
        raise _Bad(name, "must be in (0, 1]")
    return float(value)


def _check_n(value: Any, name: str) -> int:
    if not _is_int(value):
        raise _Bad(name, f"must be an integer, got {type(value).__name__}")
    if not 1 <= value <= MAX_SAMPLES:
        raise _Bad(name, f"must be between 1 and {MAX_SAMPLES}")
    return value


def _check_template_kwargs(value: Any, name: str) -> dict[str, Any]:
    """The allow-list lives with the engines' rendering (semspec.prompts), which checks it too."""
    from semspec.prompts import TemplateKwargsError, check_template_kwargs

    if not isinstance(value, dict):
        raise _Bad(name, f"must be an object, got {type(value).__name__}")
    try:
        check_template_kwargs(value)
    except TemplateKwargsError as e:
        raise _Bad(f"{name}.{e.key}", e.reason) from None
    return value


def _reference(*places: tuple[str, Any]) -> str | None:
    """The reference answer: the first `answer` found in ``places`` ((field name, object)
    pairs, e.g. the line and its metadata). A GSM8K answer text gives the number after ####."""
    from semspec.answers import reference_from

    for name, obj in places:
        if not isinstance(obj, dict) or obj.get("answer") is None:
            continue
        value = obj["answer"]
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise _Bad(f"{name}answer", f"must be a string or a number, got {type(value).__name__}")
        return reference_from(value)
    return None


def _parse_plain(obj: dict, line: int) -> Record:
    rid = _check_id(obj.get("id"), "id")
    has_prompt, has_messages = "prompt" in obj, "messages" in obj
    if has_prompt and has_messages:
        raise _Bad("prompt", "give either 'prompt' or 'messages', not both")
    rec = Record(line=line, format=PLAIN, id=rid)
    if has_prompt:
        prompt = obj["prompt"]
        if not isinstance(prompt, str):
            raise _Bad("prompt", f"must be a string, got {type(prompt).__name__}")
        if not prompt.strip():
            raise _Bad("prompt", "must not be empty")
        rec.prompt = prompt
    elif has_messages:
        rec.messages = _check_messages(obj["messages"], "messages")
    else:
        raise _Bad("prompt", "missing: each line needs 'prompt' or 'messages'")
    for key, kind in PARAM_TYPES.items():
        if key in obj and obj[key] is not None:
            rec.params[key] = _check_param(obj, key, key, kind)
    if obj.get("n") is not None:
        rec.n = _check_n(obj["n"], "n")
    if obj.get("want") is not None:
        rec.want = _check_n(obj["want"], "want")
    if obj.get("chat_template_kwargs") is not None:
        rec.chat_template_kwargs = _check_template_kwargs(obj["chat_template_kwargs"], "chat_template_kwargs")
    rec.reference = _reference(("", obj), ("metadata.", obj.get("metadata")))
    rec.meta = {k: v for k, v in obj.items() if k not in CONTROL_FIELDS}
    return rec


def _parse_batch(obj: dict, line: int) -> Record:
    rid = _check_id(obj.get("custom_id"), "custom_id")
    if not isinstance(rid, str):
        raise _Bad("custom_id", "must be a string")
    if obj.get("method") != "POST":
        raise _Bad("method", f"must be \"POST\", got {obj.get('method')!r}")
    if obj.get("url") not in BATCH_URLS:
        raise _Bad("url", f"must be one of {', '.join(BATCH_URLS)}, got {obj.get('url')!r}")
    body = obj.get("body")
    if not isinstance(body, dict):
        raise _Bad("body", "missing or not an object")
    for prefix, what, fields, allowed in (("", "line", obj, BATCH_LINE_FIELDS),
                                          ("body.", "body", body, BATCH_BODY_FIELDS)):
        unknown = [k for k in fields if k not in allowed]
        if unknown:
            raise _Bad(prefix + unknown[0], f"not supported here (a Batch {what} may hold "
                       f"{', '.join(allowed)})")
    if body.get("stream"):
        raise _Bad("body.stream", "must be false or absent: batch results are stored, not streamed")
    rec = Record(line=line, format=OPENAI_BATCH, id=rid)
    rec.messages = _check_messages(body.get("messages"), "body.messages")
    if "max_tokens" in body and "max_completion_tokens" in body:
        raise _Bad("body.max_tokens", "give max_tokens or max_completion_tokens, not both")
    for src, dst in (("max_tokens", "max_new_tokens"), ("max_completion_tokens", "max_new_tokens"),
                     ("temperature", "temperature"), ("top_p", "top_p"), ("seed", "seed")):
        if body.get(src) is not None:
            rec.params[dst] = _check_param(body, src, f"body.{src}", PARAM_TYPES[dst])
    if body.get("n") is not None:
        rec.n = _check_n(body["n"], "body.n")
    if body.get("chat_template_kwargs") is not None:  # vLLM's extension of the request body
        rec.chat_template_kwargs = _check_template_kwargs(body["chat_template_kwargs"],
                                                          "body.chat_template_kwargs")
    rec.reference = _reference(("metadata.", obj.get("metadata")), ("body.metadata.", body.get("metadata")))
    if body.get("model") is not None:
        if not isinstance(body["model"], str):
            raise _Bad("body.model", f"must be a string, got {type(body['model']).__name__}")
        rec.meta["model"] = body["model"]
    if isinstance(obj.get("metadata"), dict):
        rec.meta["metadata"] = obj["metadata"]
    return rec


class _KeyTwice(Exception):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _keys_once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's pairs as a dict; _KeyTwice when a key comes twice."""
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise _KeyTwice(key)
        obj[key] = value
    return obj


def parse_line(raw: bytes, line: int) -> Record:
    """Parse one raw line; raises _Bad with the field at fault."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _Bad(None, f"not valid UTF-8 ({e.reason} at byte {e.start})") from None
    try:
        obj = json.loads(text, object_pairs_hook=_keys_once)
    except _KeyTwice as e:
        raise _Bad(e.key, "given twice in one object (JSON would keep the last silently): give it once") from None
    except json.JSONDecodeError as e:
        raise _Bad(None, f"malformed JSON: {e.msg} (column {e.colno})") from None
    except RecursionError:
        raise _Bad(None, f"nested deeper than {MAX_DEPTH} levels") from None
    except ValueError:  # Python's guard against quadratic int parsing
        raise _Bad(None, f"a number of more than {sys.get_int_max_str_digits()} digits") from None
    if not isinstance(obj, dict):
        raise _Bad(None, f"each line must be a JSON object, got {type(obj).__name__}")
    _check_storable(obj)
    rec = _parse_batch(obj, line) if "custom_id" in obj or "body" in obj else _parse_plain(obj, line)
    rec.size = len(raw.rstrip(b"\r\n"))
    return rec


def iter_lines(path: Path, max_line_bytes: int, hasher=None) -> Iterator[tuple[int, bytes | None]]:
    """Yield (line number, raw bytes) per non-blank line; raw is None for an over-long line
    (its bytes are skipped without being held in memory)."""
    with open(path, "rb") as f:
        lineno = 0
        while True:
            raw = f.readline(max_line_bytes + 1)
            if not raw:
                return
            lineno += 1
            if hasher is not None:
                hasher.update(raw)
            if lineno == 1 and raw.startswith(codecs.BOM_UTF8):  # saved by a Windows editor
                raw = raw[len(codecs.BOM_UTF8):]
            if len(raw) > max_line_bytes and not raw.endswith(b"\n"):
                while True:  # skip the rest of the line
                    rest = f.readline(1 << 20)
                    if hasher is not None:
                        hasher.update(rest)
                    if not rest or rest.endswith(b"\n"):
                        break
                yield lineno, None
                continue
            if raw.strip():
                yield lineno, raw


def iter_records(path: Path, max_line_bytes: int, hasher=None) -> Iterator[Record | InputError]:
    for lineno, raw in iter_lines(path, max_line_bytes, hasher):
        if raw is None:
            yield InputError(lineno, None, f"line longer than {max_line_bytes} bytes "
                             "(SEMJOBS_MAX_LINE_BYTES raises the limit)")
            continue
        try:
            yield parse_line(raw, lineno)
        except _Bad as e:
            yield InputError(lineno, e.field, e.message)


def _file_problem(path: Path, max_bytes: int | None) -> str | None:
    """Why the file cannot be a job before a line is read: no regular file (a device such as
    /dev/zero never ends, a FIFO cannot be read a second time to store what was validated),
    over ``max_bytes``, or a path the job's manifest cannot store (a file name of bytes that
    are no UTF-8)."""
    st = path.stat()
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file (a device, pipe, socket or directory): give a file on disk"
    size = st.st_size
    if max_bytes is not None and size > max_bytes:
        return (f"the file is {size} bytes, more than the limit of {max_bytes} bytes per job "
                "(SEMJOBS_MAX_JOB_BYTES raises it)")
    problem = text_problem(str(path.resolve()))
    return f"its path {problem}" if problem else None


def validate_file(path: str | Path, max_line_bytes: int, samples: int = 1,
                  fits: Callable[[Any, dict | None], tuple[str, str] | None] | None = None, *,
                  max_items: int | None = None, max_bytes: int | None = None, want: int | None = None,
                  models: frozenset[str] | None = None, temperature: float | None = None) -> Validation:
    """Check the whole file without storing anything: every problem, with line and field.
    ``samples``: the job's samples per input, for lines that do not say; ``want``: the job's
    kept samples wanted per input, likewise (no line may want more than it samples). ``fits(prompt,
    template_kwargs)``: the part at fault ("prompt" or "chat_template_kwargs") and the
    problem when the target's chat template cannot render it or it overflows the context,
    else None (semjobs.jobs.context). ``max_items``: items (inputs x samples) a job may hold;
    ``max_bytes``: the bytes a job may store, each line once per sample (a file larger than
    that is refused before a line is read). ``models``: the names a Batch body's `model` may
    give (the job's target's; None: any), so that a file meant for another model is refused
    rather than answered by this one. ``temperature``: the job's, for lines that do not say
    (several samples of an input need one above 0)."""
    path = Path(path)
    problem = _file_problem(path, max_bytes)
    if problem:
        return Validation(path, None, 0, "", [InputError(0, None, problem)], 1)
    n_samples = n_wanting = 0
    hasher = hashlib.sha256()
    seen: dict[str, int] = {}
    errors: list[InputError] = []
    n_errors = 0
    fmt: str | None = None
    n = stored_bytes = 0
    too_many = too_big = False

    def err(e: InputError) -> None:
        nonlocal n_errors
        n_errors += 1
        if len(errors) < MAX_REPORTED_ERRORS:
            errors.append(e)

    for rec in iter_records(path, max_line_bytes, hasher):
        if isinstance(rec, InputError):
            err(rec)
            continue
        if fmt is None:
            fmt = rec.format
        elif rec.format != fmt:
            what = "OpenAI Batch" if rec.format == OPENAI_BATCH else "plain"
            err(InputError(rec.line, None, f"{what} line in a file of {fmt} lines; use one format"))
            continue
        key = rec.key
        if key in seen:
            name = "custom_id" if rec.format == OPENAI_BATCH else "id"
            err(InputError(rec.line, name, f"duplicate id {key!r} (first on line {seen[key]})"))
            continue
        seen[key] = rec.line
        model = rec.meta.get("model") if rec.format == OPENAI_BATCH else None
        if models is not None and model is not None and model not in models:
            err(InputError(rec.line, "body.model", f"{model!r} is not this job's target ({', '.join(sorted(models))}); "
                           "name it so, or set SEMJOBS_SERVED_MODEL_NAME to serve the target under that name"))
            continue
        problem = fits(rec.prompt if rec.prompt is not None else rec.messages,
                       rec.chat_template_kwargs) if fits else None
        if problem:
            part, message = problem
            err(InputError(rec.line, rec.field_name(part), message))
            continue
        line_temperature = rec.params.get("temperature", temperature)
        if line_temperature == 0 and rec.samples(samples) > 1:
            err(InputError(rec.line, rec.field_name("temperature" if "temperature" in rec.params else "n"),
                           f"{rec.samples(samples)} samples (the line's `n`, else the job's --n) of greedy decoding "
                           "(the line's temperature, else the job's) would be copies; give a temperature above 0"))
            continue
        wanted = rec.want if rec.want is not None else want
        if wanted is not None and wanted > rec.samples(samples):
            err(InputError(rec.line, "want" if rec.want is not None else rec.field_name("n"),
                           f"wants {wanted} kept samples (the line's `want`, else the job's --want) of "
                           f"{rec.samples(samples)} (the line's `n`, else the job's --n): at most as many as are sampled"))
            continue
        n += 1
        n_wanting += rec.want is not None
        n_samples += rec.samples(samples)
        stored_bytes += rec.size * rec.samples(samples)
        if max_bytes is not None and stored_bytes > max_bytes and not too_big:
            too_big = True  # said once, at the line that crosses the limit
            err(InputError(rec.line, rec.field_name("n") if rec.n is not None else None,
                           f"the job would store more than {max_bytes} bytes (each line once per "
                           "sample; SEMJOBS_MAX_JOB_BYTES raises the limit)"))
        if max_items is not None and n_samples > max_items and not too_many:
            too_many = True  # said once, at the line that crosses the limit
            err(InputError(rec.line, rec.field_name("n") if rec.n is not None else None,
                           f"the job would hold more than {max_items} items (inputs x samples; "
                           "SEMJOBS_MAX_JOB_ITEMS raises the limit)"))
    if n == 0 and n_errors == 0:
        err(InputError(0, None, "the file holds no items"))
    return Validation(path, fmt, n, hasher.hexdigest(), errors, n_errors, n_samples, n_wanting)
