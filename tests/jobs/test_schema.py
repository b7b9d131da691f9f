import json

import pytest

from semjobs.jobs.schema import OPENAI_BATCH, PLAIN, validate_file


def write(tmp_path, lines, name="in.jsonl"):
    p = tmp_path / name
    with open(p, "w", encoding="utf-8") as f:
        for line in lines:
            f.write((line if isinstance(line, str) else json.dumps(line)) + "\n")
    return p


def batch_line(cid, **body):
    body.setdefault("messages", [{"role": "user", "content": "What is 2+2?"}])
    return {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": body}


def test_plain_prompt_and_messages_ok(tmp_path):
    p = write(tmp_path, [
        {"id": 1, "prompt": "a"},
        "",  # blank lines are skipped
        {"id": "x", "messages": [{"role": "system", "content": "s"},
                                 {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
         "answer": "42"},
    ])
    v = validate_file(p, 10_000)
    assert v.ok and v.format == PLAIN and v.n_items == 2 and len(v.sha256) == 64


def test_batch_lines_ok(tmp_path):
    p = write(tmp_path, [batch_line("a", max_tokens=10, temperature=0.5, seed=3, model="gpt-x", stream=False),
                         batch_line("b", max_completion_tokens=5, top_p=0.9, user="u1", store=False)])
    v = validate_file(p, 10_000)
    assert v.ok and v.format == OPENAI_BATCH and v.n_items == 2


@pytest.mark.parametrize(
    "bad, line, field, words",
    [
        ('{"id": 1, "prompt": "a"', 2, None, "malformed JSON"),
        ('[1, 2]', 2, None, "JSON object"),
        ({"prompt": "no id"}, 2, "id", "missing"),
        ({"id": 1, "prompt": "dup"}, 2, "id", "duplicate"),
        ({"id": 1.5, "prompt": "x"}, 2, "id", "string or an integer"),
        ({"id": True, "prompt": "x"}, 2, "id", "string or an integer"),
        ({"id": "", "prompt": "x"}, 2, "id", "empty"),
        ({"id": "b", "prompt": "   "}, 2, "prompt", "empty"),
        ({"id": "b", "prompt": 7}, 2, "prompt", "must be a string"),
        ({"id": "b"}, 2, "prompt", "missing"),
        ({"id": "b", "prompt": "x", "messages": []}, 2, "prompt", "not both"),
        ({"id": "b", "messages": []}, 2, "messages", "empty"),
        ({"id": "b", "messages": [{"role": "user"}]}, 2, "messages[0].content", "missing"),
        ({"id": "b", "messages": [{"role": "bot", "content": "x"}]}, 2, "messages[0].role", "one of"),
        ({"id": "b", "messages": [{"role": "user", "content": " "}]}, 2, "messages", "non-empty"),
        ({"id": "b", "prompt": "x", "temperature": "hot"}, 2, "temperature", "number"),
        ({"id": "b", "prompt": "x", "max_new_tokens": 0}, 2, "max_new_tokens", "positive"),
        (batch_line("b"), 2, None, "one format"),
        ({"id": "b", "prompt": "x", "n": 0}, 2, "n", "between 1 and 64"),
        ({"id": "b", "prompt": "x", "n": 65}, 2, "n", "between 1 and 64"),
        ({"id": "b", "prompt": "x", "n": "4"}, 2, "n", "integer"),
        ({"id": "b", "prompt": "x", "want": 0}, 2, "want", "between 1 and 64"),
        ({"id": "b", "prompt": "x", "n": 2, "want": 3}, 2, "want", "at most as many as are sampled"),
        ({"id": "b", "prompt": "x", "chat_template_kwargs": "think"}, 2, "chat_template_kwargs", "object"),
        ({"id": "b", "prompt": "x", "answer": {"n": 1}}, 2, "answer", "string or a number"),
        ({"id": "b", "prompt": "x", "metadata": {"answer": True}}, 2, "metadata.answer", "string or a number"),
        ({"id": None, "prompt": "x"}, 2, "id", "missing"),
        ({"id": "b", "prompt": None}, 2, "prompt", "must be a string"),
        ({"id": "b", "prompt": "x", "temperature": 2.5}, 2, "temperature", "between 0 and 2"),
        ({"id": "b", "prompt": "x", "temperature": -0.1}, 2, "temperature", "between 0 and 2"),
        ({"id": "b", "prompt": "x", "top_p": 0}, 2, "top_p", "(0, 1]"),
        ({"id": "b", "prompt": "x", "top_p": 1.5}, 2, "top_p", "(0, 1]"),
        ({"id": "b", "prompt": "x", "max_new_tokens": -5}, 2, "max_new_tokens", "positive"),
        ({"id": "b", "prompt": "x", "max_new_tokens": 2.5}, 2, "max_new_tokens", "integer"),
        ({"id": "b", "prompt": "x", "seed": "one"}, 2, "seed", "integer"),
        ('"just a string"', 2, None, "JSON object"),
        ({"id": "b", "messages": "hello"}, 2, "messages", "list"),
        ({"id": "b", "messages": ["hello"]}, 2, "messages[0]", "object"),
    ],
)
def test_bad_plain_lines(tmp_path, bad, line, field, words):
    p = write(tmp_path, [{"id": 1, "prompt": "first"}, bad])
    v = validate_file(p, 10_000)
    assert not v.ok and v.n_errors == 1, v.errors
    err = v.errors[0]
    assert (err.line, err.field) == (line, field), str(err)
    assert words in err.message, str(err)
    assert f"line {line}" in str(err)


@pytest.mark.parametrize(
    "bad, field, words",
    [
        ({**batch_line("b"), "method": "GET"}, "method", "POST"),
        ({**batch_line("b"), "url": "/v1/embeddings"}, "url", "/v1/chat/completions"),
        ({"custom_id": "b", "method": "POST", "url": "/v1/chat/completions"}, "body", "missing"),
        (batch_line("b", max_tokens="5"), "body.max_tokens", "integer"),
        (batch_line("b", temperature=3), "body.temperature", "between"),
        (batch_line("b", n=0), "body.n", "between 1 and"),
        (batch_line("b", n=2.0), "body.n", "integer"),
        (batch_line("b", chat_template_kwargs=[1]), "body.chat_template_kwargs", "object"),
        ({**batch_line("b"), "metadata": {"answer": [1]}}, "metadata.answer", "string or a number"),
        (batch_line(7), "custom_id", "string"),
        (batch_line("a"), "custom_id", "duplicate"),
        (batch_line("b", messages=[{"role": "user", "content": [{"type": "image_url"}]}]),
         "body.messages[0].content[0]", "text parts"),
        (batch_line("b", max_tokens=0), "body.max_tokens", "positive"),
        (batch_line("b", top_p=2), "body.top_p", "(0, 1]"),
        (batch_line("b", max_tokens=5, max_completion_tokens=5), "body.max_tokens", "not both"),
        (batch_line("b", stop=["\n"]), "body.stop", "not supported here"),
        (batch_line("b", logprobs=True), "body.logprobs", "not supported here"),
        (batch_line("b", stream=True), "body.stream", "must be false"),
        ({**batch_line("b"), "priority": 1}, "priority", "not supported here"),
        ({**batch_line("b"), "body": "text"}, "body", "not an object"),
        (batch_line("b", messages=[]), "body.messages", "empty"),
    ],
)
def test_bad_batch_lines(tmp_path, bad, field, words):
    p = write(tmp_path, [batch_line("a"), bad])
    v = validate_file(p, 10_000)
    assert not v.ok and v.n_errors == 1, v.errors
    err = v.errors[0]
    assert (err.line, err.field) == (2, field), str(err)
    assert words in err.message, str(err)


def test_overlong_line_and_bad_utf8_and_all_errors_reported(tmp_path):
    p = tmp_path / "in.jsonl"
    with open(p, "wb") as f:
        f.write(b'{"id": 1, "prompt": "ok"}\n')
        f.write(b'{"id": 2, "prompt": "' + b"x" * 5000 + b'"}\n')
        f.write(b'{"id": 3, "prompt": "\xff"}\n')
        f.write(b'{"id": 4, "prompt": ""}\n')
        f.write(b'{"id": 5, "prompt": "fine"}\n')
    v = validate_file(p, 1000)
    assert [(e.line, e.field) for e in v.errors] == [(2, None), (3, None), (4, "prompt")]
    assert "longer than 1000 bytes" in v.errors[0].message
    assert "UTF-8" in v.errors[1].message
    assert v.n_items == 2  # lines 1 and 5


def test_empty_file_is_an_error(tmp_path):
    p = write(tmp_path, ["", "  "])
    v = validate_file(p, 1000)
    assert not v.ok and "no items" in str(v.errors[0])


def _records(path):
    from semjobs.jobs.schema import iter_records

    return list(iter_records(path, 10_000))


def test_samples_references_and_template_kwargs_are_read(tmp_path):
    gsm8k = "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs.\nShe makes 9 * 2 = $<<9*2=18>>18.\n#### 18"
    p = write(tmp_path, [
        {"id": "a", "prompt": "q", "answer": gsm8k, "n": 3, "chat_template_kwargs": {"enable_thinking": True}},
        {"id": "b", "prompt": "q", "metadata": {"answer": 0.5, "source": "x"}},
        {"id": "c", "prompt": "q", "extra": 1},
    ])
    v = validate_file(p, 10_000, samples=2)
    assert v.ok and v.n_items == 3 and v.n_samples == 3 + 2 + 2
    a, b, c = (r.request() for r in _records(p))
    assert a["reference"] == "18" and a["chat_template_kwargs"] == {"enable_thinking": True}
    assert a["meta"] == {"answer": gsm8k}  # the input's own fields travel to the export; n does not
    assert b["reference"] == "0.5" and b["meta"] == {"metadata": {"answer": 0.5, "source": "x"}}
    assert "reference" not in c and c["meta"] == {"extra": 1}


def test_batch_lines_take_n_and_a_reference_from_metadata(tmp_path):
    p = write(tmp_path, [{**batch_line("a", n=4), "metadata": {"answer": "#### 7"}},
                         batch_line("b", metadata={"answer": 3}, chat_template_kwargs={"reasoning_effort": "low"})])
    v = validate_file(p, 10_000)
    assert v.ok and v.n_samples == 4 + 1
    a, b = (r.request() for r in _records(p))
    assert a["reference"] == "7" and b["reference"] == "3"
    assert b["chat_template_kwargs"] == {"reasoning_effort": "low"}


def test_a_windows_file_is_valid_bom_crlf_and_no_final_newline(tmp_path):
    p = tmp_path / "win.jsonl"
    p.write_bytes(b'\xef\xbb\xbf{"id": 1, "prompt": "a"}\r\n\r\n{"id": 2, "prompt": "b"}')
    v = validate_file(p, 10_000)
    assert v.ok and v.n_items == 2, v.errors
    assert [r.prompt for r in _records(p)] == ["a", "b"]


def _nested(depth):
    """A value of ``depth`` levels of objects (its innermost holds a number)."""
    value = 1
    for _ in range(depth):
        value = {"k": value}
    return value


NUL, LONE = "\u0000", "\ud800"  # what Postgres cannot store as text; what UTF-8 cannot encode
P = {"id": "b", "prompt": "x"}  # a good plain line, to spoil one field of

# Issue 46: lines the validator passed and storing (or decoding) refused, and their cousins.
# Each is refused at its line and field, so nothing of the job is stored (tests/jobs/test_submit.py).
STORAGE_CASES = [
    ('{"id": %s, "prompt": "x"}' % ("9" * 600), "id", "longer than 512 characters"),
    ({"id": "a" * 513, "prompt": "x"}, "id", "longer than 512 characters"),
    ({"id": "é" * 513, "prompt": "x"}, "id", "longer than 512 characters"),
    ({"id": f"a{NUL}b", "prompt": "x"}, "id", "U+0000"),
    ({"id": f"a{LONE}", "prompt": "x"}, "id", "lone surrogate (U+D800)"),
    ({"id": "  ", "prompt": "x"}, "id", "empty"),
    ({"id": [1], "prompt": "x"}, "id", "string or an integer"),
    ({"id": {"n": 1}, "prompt": "x"}, "id", "string or an integer"),
    ({"id": 1e3, "prompt": "x"}, "id", "string or an integer"),
    ({**P, "prompt": f"x{NUL}y"}, "prompt", "U+0000"),
    ({**P, "prompt": f"x{LONE}"}, "prompt", "lone surrogate"),
    ({**P, "prompt": "x\udc00y"}, "prompt", "lone surrogate (U+DC00)"),
    ({"id": "b", "messages": [{"role": "user", "content": f"q{NUL}"}]}, "messages[0].content", "U+0000"),
    ({"id": "b", "messages": [{"role": "user", "content": [{"type": "text", "text": LONE}]}]},
     "messages[0].content[0].text", "lone surrogate"),
    ({"id": "b", "messages": [{"role": "user", "content": 42}]}, "messages[0].content", "not a string"),
    ({"id": "b", "messages": [{"role": "tool", "content": "x"}]}, "messages[0].role", "one of"),
    ({"id": "b", "messages": [{"role": 1, "content": "x"}]}, "messages[0].role", "not a string"),
    ({**P, f"k{NUL}": 1}, "k\\x00", "the key holds U+0000"),
    ({**P, f"k{LONE}": 1}, "k\\ud800", "the key holds a lone surrogate"),
    ({**P, "tags": ["a", f"b{NUL}"]}, "tags[1]", "U+0000"),
    ({**P, "answer": f"4{NUL}2"}, "answer", "U+0000"),
    ({**P, "metadata": {"answer": LONE}}, "metadata.answer", "lone surrogate"),
    ({**P, "score": float("nan")}, "score", "nan is not a number JSON can store"),
    ({**P, "score": float("inf")}, "score", "inf is not a number JSON can store"),
    ('{"id": "b", "prompt": "x", "score": 1e999}', "score", "inf is not a number"),
    ({**P, "deep": _nested(40)}, "deep" + ".k" * 31, "nested deeper than 32 levels"),
    ('{"id": "b", "prompt": "x", "deep": ' + "[" * 5000 + "]" * 5000 + "}", None, "nested deeper"),
    ('{"id": "b", "prompt": "x", "big": ' + "7" * 5000 + "}", None, "digits"),
    ({**P, "seed": 2**64}, "seed", "at most 9223372036854775807"),
    ({**P, "seed": 2**63}, "seed", "at most 9223372036854775807"),
    ({**P, "seed": -1}, "seed", "must not be negative"),
    ({**P, "seed": True}, "seed", "integer"),
    ({**P, "seed": 1.0}, "seed", "integer"),
    ({**P, "max_new_tokens": 2**31}, "max_new_tokens", "at most 2147483647"),
    ({**P, "max_new_tokens": True}, "max_new_tokens", "integer"),
    ({**P, "n": True}, "n", "integer"),
    ({**P, "n": 10**30}, "n", "between 1 and 64"),
    ({**P, "temperature": float("nan")}, "temperature", "not a number JSON can store"),
    ({**P, "temperature": True}, "temperature", "number"),
    ({**P, "top_p": float("inf")}, "top_p", "not a number JSON can store"),
    ({**P, "top_p": 1.0000001}, "top_p", "(0, 1]"),
    ({**P, "chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs.tokenize", "not allowed"),
    ({**P, "chat_template_kwargs": {"chat_template": "{% for i in range(10**9) %}{% endfor %}"}},
     "chat_template_kwargs.chat_template", "not allowed"),
    ({**P, "chat_template_kwargs": {"add_generation_prompt": False}},
     "chat_template_kwargs.add_generation_prompt", "not allowed"),
    ({**P, "chat_template_kwargs": {"enable_thinking": True, "tools": []}}, "chat_template_kwargs.tools",
     "not allowed"),
    ({**P, "chat_template_kwargs": {"enable_thinking": {"on": True}}}, "chat_template_kwargs.enable_thinking",
     "must be a string, number, boolean or null"),
    ({**P, "chat_template_kwargs": {"reasoning_effort": ["high"]}}, "chat_template_kwargs.reasoning_effort",
     "must be a string, number, boolean or null"),
    ({**P, "chat_template_kwargs": {"reasoning_effort": f"hi{NUL}"}}, "chat_template_kwargs.reasoning_effort",
     "U+0000"),
    (batch_line(f"c{NUL}"), "custom_id", "U+0000"),
    (batch_line("c" * 513), "custom_id", "longer than 512 characters"),
    (batch_line("c", seed=2**64), "body.seed", "at most 9223372036854775807"),
    (batch_line("c", seed=-5), "body.seed", "must not be negative"),
    (batch_line("c", max_tokens=2**40), "body.max_tokens", "at most 2147483647"),
    (batch_line("c", chat_template_kwargs={"tokenize": True}), "body.chat_template_kwargs.tokenize", "not allowed"),
    (batch_line("c", messages=[{"role": "user", "content": LONE}]), "body.messages[0].content", "lone surrogate"),
    ({**batch_line("c"), "metadata": {"note": NUL}}, "metadata.note", "U+0000"),
]


@pytest.mark.parametrize("bad, field, words", STORAGE_CASES)
def test_what_storing_would_refuse_is_refused_with_line_and_field(tmp_path, bad, field, words):
    first = batch_line("a") if isinstance(bad, dict) and "custom_id" in bad else {"id": 1, "prompt": "first"}
    p = write(tmp_path, [first, bad])
    v = validate_file(p, 100_000)
    assert not v.ok and v.n_errors == 1 and v.n_items == 1, v.errors
    err = v.errors[0]
    assert (err.line, err.field) == (2, field), str(err)
    assert words in err.message, str(err)
    assert str(err).startswith("line 2") and NUL not in str(err) and str(err).encode("utf-8")


# Odd but valid: these must still pass, and store (tests/jobs/test_submit.py stores them in Postgres).
ODD_BUT_VALID = [
    {"id": "問題-①-🙂", "prompt": "¿Cuánto es 2+2? 🙂"},
    {"id": "é" * 512, "prompt": "an id of exactly 512 characters (1024 bytes)"},
    {"id": int("9" * 512), "prompt": "an integer id of 512 digits"},
    {"id": -7, "prompt": "a negative integer id"},
    {"id": 0, "prompt": "id zero"},
    {"id": " spaced id ", "prompt": "a tab\t, \x01 (control characters other than NUL), \u200f an RTL mark"},
    {"id": "meta", "prompt": "x", "metadata": {}, "": "an empty key", "tags": []},
    {"id": "deep", "prompt": "x", "deep": _nested(31)},
    {"id": "seed0", "prompt": "x", "seed": 0, "temperature": 0.01, "top_p": 1, "n": 64},
    {"id": "seedmax", "prompt": "x", "seed": 2**63 - 1, "temperature": 2, "max_new_tokens": 2**31 - 1},
    {"id": "think", "prompt": "x", "chat_template_kwargs": {"enable_thinking": False}},
    {"id": "kw", "prompt": "x", "chat_template_kwargs": {"reasoning_effort": "high", "thinking": None}},
    {"id": "nokw", "prompt": "x", "chat_template_kwargs": {}},
    {"id": "pair", "prompt": "a surrogate pair is one character: \U0001F600", "answer": 1e308},
]


def test_odd_but_valid_lines_pass(tmp_path):
    p = write(tmp_path, ODD_BUT_VALID)
    v = validate_file(p, 100_000)
    assert v.ok and v.n_items == len(ODD_BUT_VALID), v.errors
    requests = [r.request() for r in _records(p)]
    assert requests[2]["id"] == int("9" * 512) and requests[9]["params"]["seed"] == 2**63 - 1
    assert requests[10]["chat_template_kwargs"] == {"enable_thinking": False}


def test_batch_odd_but_valid(tmp_path):
    p = write(tmp_path, [batch_line("ü" * 512, seed=0, chat_template_kwargs={"enable_thinking": False}),
                         batch_line("b", seed=2**63 - 1, max_tokens=2**31 - 1)])
    assert validate_file(p, 100_000).ok


def test_a_job_over_the_items_limit_is_refused_once_at_the_line_that_crosses_it(tmp_path):
    p = write(tmp_path, [{"id": 1, "prompt": "a"}, {"id": 2, "prompt": "b"}, {"id": 3, "prompt": "c", "n": 3},
                         {"id": 4, "prompt": "d"}])
    assert validate_file(p, 10_000, samples=2, max_items=9).ok  # 2 + 2 + 3 + 2
    v = validate_file(p, 10_000, samples=2, max_items=6)
    assert v.n_errors == 1 and (v.errors[0].line, v.errors[0].field) == (3, "n")
    assert "more than 6 items (inputs x samples; SEMJOBS_MAX_JOB_ITEMS raises the limit)" in v.errors[0].message
    v = validate_file(p, 10_000, samples=2, max_items=3)
    assert v.n_errors == 1 and (v.errors[0].line, v.errors[0].field) == (2, None)


def test_a_file_over_the_bytes_limit_is_refused_before_a_line_is_read(tmp_path):
    p = write(tmp_path, [{"id": 1, "prompt": "a"}, {"id": 1, "prompt": "a duplicate, never read"}])
    size = p.stat().st_size
    v = validate_file(p, 10_000, max_bytes=size - 1)
    assert not v.ok and v.n_errors == 1 and v.errors[0].line == 0
    assert str(v.errors[0]) == (f"file: the file is {size} bytes, more than the limit of {size - 1} bytes per "
                                "job (SEMJOBS_MAX_JOB_BYTES raises it)")
    assert validate_file(p, 10_000, max_bytes=size).errors[0].field == "id"  # read: the duplicate


def test_the_bytes_limit_counts_each_line_once_per_sample_it_stores(tmp_path):
    """A 1 MB line with n 64 stores 64 MB: the limit is on what is stored, not the file."""
    lines = [{"id": 1, "prompt": "x" * 100}, {"id": 2, "prompt": "y" * 100, "n": 8}]
    p = write(tmp_path, lines)
    first, second = (len(line) for line in p.read_bytes().splitlines())
    assert validate_file(p, 10_000, samples=2, max_bytes=2 * first + 8 * second).ok
    v = validate_file(p, 10_000, samples=2, max_bytes=2 * first + 8 * second - 1)
    assert v.n_errors == 1 and (v.errors[0].line, v.errors[0].field) == (2, "n")
    assert "would store more than" in v.errors[0].message and "SEMJOBS_MAX_JOB_BYTES" in v.errors[0].message


def test_an_over_long_line_names_the_setting_that_raises_the_limit(tmp_path):
    p = write(tmp_path, [{"id": 1, "prompt": "x" * 200}])
    v = validate_file(p, 100)
    assert str(v.errors[0]) == "line 1: line longer than 100 bytes (SEMJOBS_MAX_LINE_BYTES raises the limit)"


def test_a_file_whose_path_is_no_utf8_cannot_be_stored(tmp_path):
    p = tmp_path / "q\udcff.jsonl"  # a file name of bytes that are not UTF-8, as Python reads it
    p.write_text('{"id": 1, "prompt": "a"}\n')
    v = validate_file(p, 10_000)
    assert not v.ok and v.errors[0].line == 0 and "its path holds a lone surrogate (U+DCFF)" in v.errors[0].message


@pytest.mark.parametrize("name, problem", [
    ("n" * 200, None),
    ("名" * 200, None),
    ("n" * 201, "longer than 200 characters"),
    ("bad\udcffname", "lone surrogate"),
])
def test_job_names_are_checked_against_their_column(name, problem):
    from semjobs.jobs.schema import name_problem

    found = name_problem(name)
    assert found is None if problem is None else problem in found


def test_a_lines_want_is_stored_with_its_request_and_counted(tmp_path):
    from semjobs.jobs.schema import iter_records

    p = write(tmp_path, [{"id": "a", "prompt": "q", "n": 8, "want": 2}, {"id": "b", "prompt": "r"}])
    v = validate_file(p, 10_000, samples=4)
    assert v.ok and v.n_samples == 12 and v.n_wanting == 1
    first, second = iter_records(p, 10_000)
    assert first.request()["want"] == 2 and "want" not in first.meta and "want" not in second.request()


def test_the_jobs_want_is_checked_against_each_lines_own_n(tmp_path):
    p = write(tmp_path, [{"id": "a", "prompt": "q"}, {"id": "b", "prompt": "r", "n": 2},
                         {"id": "c", "prompt": "s", "n": 2, "want": 1}])
    v = validate_file(p, 10_000, samples=4, want=3)
    assert [(e.line, e.field) for e in v.errors] == [(2, "n")] and "wants 3 kept samples" in v.errors[0].message


def test_a_batch_body_naming_another_model_is_refused_by_line_and_field(tmp_path):
    """vLLM's run-batch writes an error for a line naming a model it does not serve; a job
    must not answer it with its own target and export that as the line's answer."""
    p = write(tmp_path, [batch_line("a", model="HuggingFaceTB/SmolLM2-135M-Instruct"), batch_line("b"),
                         batch_line("c", model="NonExistModel")])
    v = validate_file(p, 10_000, models=frozenset({"HuggingFaceTB/SmolLM2-135M-Instruct"}))
    assert not v.ok and [(e.line, e.field) for e in v.errors] == [(3, "body.model")]
    assert "'NonExistModel' is not this job's target" in v.errors[0].message
    assert "SEMJOBS_SERVED_MODEL_NAME" in v.errors[0].message
    assert validate_file(p, 10_000).ok  # no names given: any model


def test_a_batch_body_model_must_be_a_string(tmp_path):
    v = validate_file(write(tmp_path, [batch_line("a", model={"name": "x"})]), 10_000, models=frozenset({"x"}))
    assert [(e.field, e.message) for e in v.errors] == [("body.model", "must be a string, got dict")]


@pytest.mark.parametrize("kind", ["device", "fifo", "directory"])
def test_a_path_that_is_no_regular_file_is_refused_before_a_line_is_read(tmp_path, kind):
    """/dev/zero read as lines never ends; a FIFO read to validate is empty when read to store."""
    import os

    path = {"device": lambda: "/dev/zero", "directory": lambda: tmp_path,
            "fifo": lambda: (os.mkfifo(tmp_path / "p"), tmp_path / "p")[1]}[kind]()
    v = validate_file(path, 10_000)
    assert not v.ok and v.n_items == 0 and "not a regular file" in v.errors[0].message


@pytest.mark.parametrize("raw, key", [
    ('{"id": 1, "prompt": "a", "prompt": "b"}', "prompt"),
    ('{"custom_id": "c", "method": "POST", "url": "/v1/chat/completions", '
     '"body": {"messages": [{"role": "user", "content": "x"}], "temperature": 0, "temperature": 1}}', "temperature"),
])
def test_a_key_given_twice_is_refused_by_line_and_key(tmp_path, raw, key):
    v = validate_file(write(tmp_path, ['{"id": 0, "prompt": "fine"}', raw]), 10_000)
    assert [(e.line, e.field) for e in v.errors] == [(2, key)] and "given twice" in v.errors[0].message


@pytest.mark.parametrize("line, samples, field", [
    ({"id": "a", "prompt": "x", "n": 4}, 1, "n"),                                    # the job's T 0
    ({"id": "a", "prompt": "x", "temperature": 0}, 4, "temperature"),                # the job's --n 4
    (batch_line("a", n=3, temperature=0), 1, "body.temperature"),
])
def test_a_line_asking_for_greedy_copies_is_refused_as_the_job_would_be(tmp_path, line, samples, field):
    v = validate_file(write(tmp_path, [line]), 10_000, samples, temperature=0.0 if "temperature" not in str(line)
                      else 0.6)
    assert [(e.line, e.field) for e in v.errors] == [(1, field)] and "greedy decoding" in v.errors[0].message
    sampled = {**line, "temperature": 0.7} if "custom_id" not in line else batch_line("a", n=3, temperature=0.7)
    assert validate_file(write(tmp_path, [sampled], "ok.jsonl"), 10_000, samples, temperature=0.0).ok
