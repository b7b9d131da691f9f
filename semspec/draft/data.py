"""Training text for the draft, in the target's chat format: the target's own answers (vLLM
decodes them: ``semspec.draft.train.target_answers``) and reference solutions (teacher-forced).
``generate_sequences`` is transformers' greedy decoding, for measurements outside vLLM."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import torch

_CALC = re.compile(r"<<[^>]*>>")


@dataclass
class Sequence:
    ids: list[int]  # prompt + response token ids
    prompt_len: int  # response starts here; loss positions predict ids[prompt_len:]
    source: str  # "gen" (the target's own greedy answer), "sampled" (one it sampled) or "ref" (a reference solution)
    question: int | None = None  # which answered question (index after the holdout), for a held-out split


def load_questions(path: str, holdout: int) -> list[dict]:
    """Rows of a GSM8K-style JSONL, without the first ``holdout`` lines (the benchmark slice)."""
    rows = []
    with open(path) as fh:
        for i, line in enumerate(fh):
            if i < holdout or not line.strip():
                continue
            rows.append(json.loads(line))
    return rows


def clean_reference(answer: str) -> str:
    """Drop GSM8K calculator annotations (``<<2*3=6>>``)."""
    return _CALC.sub("", answer).strip()


def prompt_ids(tokenizer, question: str) -> list[int]:
    msgs = [{"role": "user", "content": question}]
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    else:
        text = question + "\n"
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def reference_sequences(tokenizer, rows: list[dict]) -> list[Sequence]:
    out = []
    eos = tokenizer.eos_token_id
    for r in rows:
        p = prompt_ids(tokenizer, r["question"])
        resp = tokenizer(clean_reference(r["answer"]), add_special_tokens=False)["input_ids"]
        if eos is not None:
            resp = resp + [eos]
        out.append(Sequence(ids=p + resp, prompt_len=len(p), source="ref"))
    return out


@torch.inference_mode()
def generate_sequences(model, tokenizer, questions: list[str], max_new_tokens: int, batch_size: int,
                       log=None) -> list[Sequence]:
    """The target's greedy answers, batched with left padding; cut after the first EOS."""
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    device = next(model.parameters()).device
    out: list[Sequence] = []
    for start in range(0, len(questions), batch_size):
        prompts = [prompt_ids(tokenizer, q) for q in questions[start:start + batch_size]]
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        gen = model.generate(
            input_ids=ids.to(device), attention_mask=mask.to(device), do_sample=False,
            max_new_tokens=max_new_tokens, pad_token_id=pad, eos_token_id=eos,
        )[:, width:].tolist()
        for p, g in zip(prompts, gen):
            resp = []
            for t in g:
                resp.append(t)
                if t == eos:
                    break
            out.append(Sequence(ids=p + resp, prompt_len=len(p), source="gen"))
        if log:
            log(f"generated {len(out)}/{len(questions)}")
    return out
