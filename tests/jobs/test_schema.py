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
                         batch_line("b", metadata={"answer": 3}, chat_template_kwargs={"x": 1})])
    v = validate_file(p, 10_000)
    assert v.ok and v.n_samples == 4 + 1
    a, b = (r.request() for r in _records(p))
    assert a["reference"] == "7" and b["reference"] == "3" and b["chat_template_kwargs"] == {"x": 1}


def test_a_windows_file_is_valid_bom_crlf_and_no_final_newline(tmp_path):
    p = tmp_path / "win.jsonl"
    p.write_bytes(b'\xef\xbb\xbf{"id": 1, "prompt": "a"}\r\n\r\n{"id": 2, "prompt": "b"}')
    v = validate_file(p, 10_000)
    assert v.ok and v.n_items == 2, v.errors
    assert [r.prompt for r in _records(p)] == ["a", "b"]
