"""TEST DOUBLE: an instant engine with the real engine's interface, for queue/database tests
and the service-overhead benchmark. It loads nothing and "generates" an echo in two steps.

Select it with SEMJOBS_ENGINE_FACTORY=tests.fake_engine:InstantEngine.load (the repository
root must be importable, e.g. PYTHONPATH=.). Knobs, read from the environment at load time:
- FAKE_ENGINE_DELAY_S: seconds to sleep per item (to kill a worker mid-job);
- a prompt containing "FAIL" raises, to exercise failed items.
"""

from __future__ import annotations

import os
import sys
import time

from semspec.types import Counters, GenerationConfig, GenerationResult, StepRecord


class InstantEngine:
    def __init__(self, delay_s: float = 0.0):
        self.delay_s = delay_s
        self.identities = {"target": "fake-instant@sha256:0", "draft": "fake-instant@sha256:0"}
        if "torch" in sys.modules:  # e.g. imported to apply SEMJOBS_THREADS: let tests see
            # (in the job manifest) what torch got in the process that runs the engine.
            self.identities["torch_threads"] = str(sys.modules["torch"].get_num_threads())
        self.calls = 0

    @classmethod
    def load(cls, target=None, draft=None, probes=None, device="auto", cache_dir=None):
        return cls(float(os.environ.get("FAKE_ENGINE_DELAY_S", "0") or 0))

    def generate(self, prompt, config: GenerationConfig) -> GenerationResult:
        t0 = time.perf_counter()
        self.calls += 1
        if isinstance(prompt, list):
            prompt = "\n".join(m["content"] for m in prompt)
        if "FAIL" in prompt:
            raise ValueError("fake engine asked to fail")
        if self.delay_s:
            time.sleep(self.delay_s)
        words = prompt.split()[: max(1, config.max_new_tokens)]
        step1 = "Let me think. " + " ".join(words[: len(words) // 2 + 1])
        step2 = f"The answer is {len(words)}."
        steps = [
            StepRecord(0, "draft", step1, drafted_tokens=len(step1.split()),
                       accepted_tokens=len(step1.split()), decision="accepted",
                       p_target=0.9, p_draft=0.8, accept_prob=1.0, seconds=0.0,
                       target_tokens=len(step1.split())),
            StepRecord(1, "target", step2, drafted_tokens=3, accepted_tokens=0,
                       decision="rejected", p_target=0.1, p_draft=0.7, accept_prob=0.14,
                       seconds=0.0, target_tokens=len(step2.split()),
                       draft_text="The answer is unknown.", judge_score=3),
        ]
        text = step1 + "\n\n" + step2
        c = Counters(prompt_tokens=len(prompt.split()), generated_tokens=len(text.split()),
                     target_forward_passes=3, draft_forward_passes=2,
                     drafted_tokens=steps[0].drafted_tokens + 3,
                     accepted_tokens=steps[0].accepted_tokens, steps_drafted=2, steps_accepted=1)
        c.add_time("draft", 0.0)
        return GenerationResult(text=text, final_answer=str(len(words)), steps=steps, counters=c,
                                wall_seconds=time.perf_counter() - t0, finish_reason="eos",
                                models=dict(self.identities))
