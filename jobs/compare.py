"""Jobs over the same input side by side (`semjobs compare A B [C ...]`, each against A): the
speed a method bought and what it cost the text, e.g. token_sd (B) and semspec (C) against
ar (A).

- tokens/s: each job's generated tokens over its elapsed time (what a deployment pays for);
- samples kept: each job's samples its dataset keeps (right by the reference; without one,
  ended with an answer) of those it finished: what a user pays the tokens for;
- steps kept: B's drafted steps kept (its step acceptance);
- the target's log-likelihood: the mean over the samples both jobs finished of the target's
  mean per-token log-probability of each output (``semspec.quality``), and A's minus B's: how
  much less the target likes B's text (the bench's gap, in nats per token).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Iterator

from semjobs.jobs.export import iter_inputs
from semjobs.jobs.status import job_status
from semjobs.settings import settings


class NotComparable(ValueError):
    """The jobs cannot be compared (missing, or run on different inputs)."""


@dataclass
class Side:
    job_id: str
    method: str
    tokens_per_s: float | None
    step_acceptance: float | None
    kept: int = 0  # samples kept (semspec.answers.is_kept)
    done: int = 0  # samples finished
    mean_loglik: float | None = None


@dataclass
class Comparison:
    a: Side
    b: Side
    samples: int  # finished in both jobs (the log-likelihood's sample)

    @property
    def speedup(self) -> float | None:
        if not self.a.tokens_per_s or self.b.tokens_per_s is None:
            return None
        return self.b.tokens_per_s / self.a.tokens_per_s

    @property
    def loglik_gap(self) -> float | None:
        if self.a.mean_loglik is None or self.b.mean_loglik is None:
            return None
        return self.a.mean_loglik - self.b.mean_loglik

    def line(self) -> str:
        """One line, B against A."""
        a, b = self.a, self.b
        parts = [f"{b.method} vs {a.method} on the same {self.samples} sample(s):"]
        parts.append("-" if self.speedup is None else
                     f"{self.speedup:.2f}x tokens/s ({b.tokens_per_s:.1f} vs {a.tokens_per_s:.1f}),")
        parts.append(f"samples kept {b.kept}/{b.done} vs {a.kept}/{a.done},")
        if b.step_acceptance is not None:
            parts.append(f"{b.step_acceptance:.0%} of drafted steps kept,")
        if self.loglik_gap is None:
            parts.append("target log-likelihood not measured")
        else:
            parts.append(f"target log-likelihood {b.mean_loglik:.3f} vs {a.mean_loglik:.3f} nats/token "
                         f"(gap {self.loglik_gap:.3f})")
        return " ".join(parts)


def compare_jobs(job_a: str, job_b: str, *, url: str | None = None, loglik: bool = True) -> Comparison:
    """``job_b`` against ``job_a``; NotComparable when either is missing or their inputs
    differ. ``loglik``: score both jobs' outputs with the target the jobs decoded with (loaded
    with transformers here: seconds for the embedded one)."""
    statuses = [job_status(j, url=url) for j in (job_a, job_b)]
    for job_id, st in zip((job_a, job_b), statuses):
        if st is None:
            raise NotComparable(f"no job {job_id!r}")
    inputs = [st["manifest"].get("input", {}).get("sha256") for st in statuses]
    if inputs[0] != inputs[1]:
        raise NotComparable(f"jobs {job_a} and {job_b} ran on different inputs: compare jobs of one file")
    targets = {st["manifest"].get("models", {}).get("target") for st in statuses}
    if len(targets) != 1:
        raise NotComparable(f"jobs {job_a} and {job_b} decoded with different targets ({', '.join(map(str, targets))})")
    sides = [Side(st["id"], st["method"], st["tokens_per_s"], st["acceptance"]["step_acceptance"],
                  st["yield"]["kept"], st["counts"]["done"]) for st in statuses]
    pairs = _paired_outputs(job_a, job_b, url)
    if loglik and pairs:
        target = _scorer(targets.pop())
        for i, side in enumerate(sides):
            side.mean_loglik = _mean_loglik(target, [(prompt, texts[i]) for prompt, texts in pairs])
    return Comparison(sides[0], sides[1], len(pairs))


@functools.cache
def _scorer(spec: str | None):
    """The target that scores outputs, loaded once per process (a compare of several jobs
    scores each against the first with it)."""
    from semspec.quality import load_scorer

    return load_scorer(None if spec in (None, "embedded") else spec, settings.cache_dir)


def _finished(job_id: str, url: str | None) -> Iterator[tuple[tuple[str, int], Any, str]]:
    """((input id, sample), the prompt, the output) of each finished sample."""
    for _, done, _, _ in iter_inputs(job_id, url=url):
        for kept in done:
            request = kept.item.request
            yield (kept.item.item_id, kept.item.sample), request.get("messages") or request["prompt"], kept.out.text


def _paired_outputs(job_a: str, job_b: str, url: str | None) -> list[tuple[Any, tuple[str, str]]]:
    """(prompt, (A's output, B's output)) of the samples both jobs finished."""
    mine = {key: (prompt, text) for key, prompt, text in _finished(job_a, url)}
    return [(mine[key][0], (mine[key][1], text)) for key, _, text in _finished(job_b, url) if key in mine]


def _mean_loglik(target, outputs: list[tuple[Any, str]]) -> float | None:
    from semspec.quality import target_mean_loglik

    values = [v for v in (target_mean_loglik(target, prompt, text) for prompt, text in outputs) if v is not None]
    return sum(values) / len(values) if values else None
