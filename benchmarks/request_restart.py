"""What a new request costs a token_sd engine with the shipped head: greedy 256-token answers to 6
GSM8K questions (test lines 1-6) written in one request each, then in chunks of 64, 32 and 20
tokens, each chunk a new request continuing the text (as the step-level methods' writer writes
a step, or a back-off's steps, at a time). Greedy, so every variant writes the same tokens;
batch 1, the machine's torch threads.

    python benchmarks/request_restart.py --out docs/benchmarks/request_restart/cpu.json
    python benchmarks/request_restart.py --recompute-last-block --out .../cpu_recompute.json

``--recompute-last-block``: vLLM's own prefix caching for a head, which recomputes a new
request's last cached block (what semjobs did before it kept that block on a CPU:
semspec.engine.token_engine.HEAD_METHODS).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

CHUNKS = (256, 64, 32, 20)
ANSWER_TOKENS = 256


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recompute-last-block", action="store_true")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    from _common import GSM8K, write_json
    from vllm import SamplingParams

    from semspec.engine import token_engine

    if args.recompute_last_block:
        token_engine.HEAD_METHODS = ()
    engine = token_engine.VLLMEngine.load(speculative_tokens=4, batch_size=4)
    llm, tokenizer = engine.llm, engine.tokenizer
    questions = [json.loads(line)["question"] for line in GSM8K.read_text().splitlines()[:6]]
    prompts = [list(tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                                  tokenize=True, return_dict=True)["input_ids"]) for q in questions]
    count = 0

    def write(ids: list[int], tokens: int) -> list[int]:
        nonlocal count
        count += 1
        llm.add_request(str(count), {"prompt_token_ids": ids},
                        SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True))
        finished = None
        while llm.has_unfinished_requests():
            finished = next((o for o in llm.step() if o.finished), finished)
        return list(finished.outputs[0].token_ids)

    write(prompts[0], 16)  # warm-up
    rows, answers = [], {}
    for chunk in CHUNKS:
        started, texts = time.perf_counter(), []
        for prompt in prompts:
            ids = list(prompt)
            while len(ids) - len(prompt) < ANSWER_TOKENS:
                ids += write(ids, min(chunk, ANSWER_TOKENS - (len(ids) - len(prompt))))
            texts.append(ids[len(prompt):])
        seconds = time.perf_counter() - started
        answers[chunk] = texts
        rows.append({"chunk_tokens": chunk, "requests_per_answer": -(-ANSWER_TOKENS // chunk),
                     "tokens_per_second": round(len(prompts) * ANSWER_TOKENS / seconds, 2),
                     "same_tokens_as_one_request": sum(a == b for a, b in zip(texts, answers[CHUNKS[0]]))})
        print(rows[-1], flush=True)
    one = rows[0]["tokens_per_second"]
    for row in rows:
        row["vs_one_request"] = round(row["tokens_per_second"] / one, 3)
    write_json({"recompute_last_block": args.recompute_last_block, "questions": len(prompts),
                "answer_tokens": ANSWER_TOKENS, "rows": rows}, args.out)


if __name__ == "__main__":
    main()
