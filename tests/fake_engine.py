"""TEST DOUBLE: an instant engine with the real engine's interface, for queue/database tests
and the service-overhead benchmark. It loads nothing and "generates" an echo in two steps.

Select it with SEMJOBS_ENGINE_FACTORY=tests.fake_engine:InstantEngine.load (the repository
root must be importable, e.g. PYTHONPATH=.). Knobs, read from the environment at load time:
- FAKE_ENGINE_DELAY_S: seconds each item takes (items of one batch run side by side, as in
  the real engine), to kill a worker mid-job;
- FAKE_ENGINE_GATE: a path; items finish only once it exists (a test holds them running
  until the moment it chooses);
- a prompt containing "FAIL" raises, to exercise failed items;
- a prompt containing "KILL" SIGKILLs the process decoding it (a poison item);
- a prompt containing "SLOW" takes SLOW_FACTOR times FAKE_ENGINE_DELAY_S (a long answer);
- a nonzero seed changes the text and adds seed % 3 to the answer (samples differ).
"""

from __future__ import annotations

import os
import signal
import sys
import time

from semspec.answers import split_reasoning
from semspec.intake import Intake
from semspec.types import Abort, Cancelled, Counters, Finished, GenerationConfig, GenerationResult, StepRecord


SLOW_FACTOR = 15


class InstantEngine:
    def __init__(self, delay_s: float = 0.0):
        self.delay_s = delay_s
        self.gate: str | None = None  # FAKE_ENGINE_GATE
        self.identities = {"target": "fake-instant@sha256:0", "draft": "fake-instant@sha256:0"}
        if "torch" in sys.modules:  # e.g. imported to apply SEMJOBS_THREADS: let tests see
            # (in the job manifest) what torch got in the process that runs the engine.
            self.identities["torch_threads"] = str(sys.modules["torch"].get_num_threads())
        self.calls = 0

    @classmethod
    def load(cls, target=None, draft=None, probes=None, device="auto", cache_dir=None, **_settings):
        engine = cls(float(os.environ.get("FAKE_ENGINE_DELAY_S", "0") or 0))
        engine.gate = os.environ.get("FAKE_ENGINE_GATE")
        return engine

    def generate_many(self, requests, config=None, batch_size=1):
        """The real engine's interface and batching: up to ``batch_size`` items in flight,
        each finishing ``delay_s`` after it started, the next taken as a slot frees (a None
        from the source: nothing ready yet; an Abort: that item ends Cancelled now)."""
        intake = Intake(requests)
        active: list[tuple[float, object]] = []  # (due, request)
        while True:
            while (req := intake.next(room=len(active) < batch_size)) is not None:
                if isinstance(req, Abort):
                    aborted = [a for a in active if a[1].key == req.key]
                    for a in aborted:
                        active.remove(a)
                        yield Finished(req.key, None, Cancelled(f"request {req.key!r} aborted"))
                else:
                    slow = SLOW_FACTOR if "SLOW" in str(req.prompt) else 1
                    active.append((time.monotonic() + self.delay_s * slow, req))
            if not active:
                if intake.exhausted:
                    return
                time.sleep(0.005)  # nothing in flight and nothing ready: the source was polled
                continue
            due, req = min(active, key=lambda a: a[0])
            held = self.gate is not None and not os.path.exists(self.gate)
            time.sleep(0.02 if held else max(0.0, min(due - time.monotonic(), 0.02)))
            if held or time.monotonic() < due:
                continue
            active.remove((due, req))
            try:
                yield Finished(req.key, self._answer(req.prompt, req.config or config))
            except ValueError as e:
                yield Finished(req.key, None, e)

    def generate(self, prompt, config: GenerationConfig) -> GenerationResult:
        time.sleep(self.delay_s)
        return self._answer(prompt, config)

    def _answer(self, prompt, config: GenerationConfig) -> GenerationResult:
        t0 = time.perf_counter()
        self.calls += 1
        if isinstance(prompt, list):
            prompt = "\n".join(m["content"] for m in prompt)
        if "KILL" in prompt:
            os.kill(os.getpid(), signal.SIGKILL)
        if "FAIL" in prompt:
            raise ValueError("fake engine asked to fail")
        words = prompt.split()[: max(1, config.max_new_tokens)]
        step1 = "Let me think. " + " ".join(words[: len(words) // 2 + 1])
        if config.seed:  # other seeds (a job's later samples) think and answer otherwise
            step1 += f" (seed {config.seed})"
        answer = len(words) + (config.seed % 3 if config.seed else 0)
        step2 = f"The answer is {answer}."
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
        reasoning, content = split_reasoning(text)
        return GenerationResult(text=text, final_answer=str(answer), reasoning=reasoning, content=content,
                                steps=steps, counters=c, wall_seconds=time.perf_counter() - t0, finish_reason="eos",
                                models=dict(self.identities))
