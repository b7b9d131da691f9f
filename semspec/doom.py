"""Doomed samples stopped early: a rule, calibrated on a target's own sampled traces, that a
partial trace will not end right.

A sampled trace that will end wrong is mostly long (small models ramble, loop with changing
numbers, or write step after step of a solution they cannot finish) and written with low
confidence. The rule (``DoomRule``) reads one number per generated token (``SIGNALS``): the
sampled token's log-probability (``logprob``) or DeepConf's token confidence (``confidence``:
minus the mean of the ``TOP_LOGPROBS`` highest log-probabilities, arXiv 2508.15260), averages
it over the last ``window`` tokens, and stops the sample at the first token, from
``min_tokens`` on, where that mean falls below ``threshold`` (an infinite threshold stops
every sample at ``min_tokens``: a length cap, which calibration picks where right answers are
short).

``calibrate`` chooses the signal, window, minimum length and threshold on traces sampled to
their end with their answers checked: of every candidate, the threshold that spares at least
the promised share of the right traces (``recall``, plus a margin for the calibration's own
sampling error, so the promise holds on problems it did not see), and of those the one that
spares the most tokens. The rule is for the target and the domain it was calibrated on: it
names the target's identity, and an engine refuses it for another.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections import deque
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Iterable, Sequence

SIGNALS = ("logprob", "confidence")
# A rule's kind: a signal with a finite threshold, or a length cap. A length cap is the kind the
# step methods apply (they read no per-token log-probabilities) and asks vLLM for none.
LENGTH = "length"
KINDS = (*SIGNALS, LENGTH)
TOP_LOGPROBS = 5  # the log-probabilities DeepConf's confidence averages
WINDOWS = (8, 16, 32)
# The first token a rule may stop at; the longer ones let a domain whose right traces run long
# (GSM8K's, a few hundred tokens on SmolLM2) still cap the wrong ones that run on.
MIN_TOKENS = (32, 48, 64, 96, 128, 192, 256, 320, 384, 448)
# The promise on recall holds on unseen problems with this confidence when the calibration's
# right traces are a fair sample of them (an exact binomial bound: allowed_stops).
PROMISE_CONFIDENCE = 0.95


class DoomRuleError(ValueError):
    pass


@dataclass(frozen=True)
class DoomRule:
    signal: str  # one of SIGNALS
    window: int  # tokens the signal is averaged over
    min_tokens: int  # no sample is stopped before it has this many
    threshold: float  # stop once the window's mean is below it (inf: at min_tokens)
    recall: float  # the share of right samples it promises to spare
    target: str  # the identity of the target it was calibrated on ("name@sha256:...")
    # how it was chosen: traces, right ones, spared tokens and recall on them, the settings
    calibration: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        if self.signal not in SIGNALS:
            raise DoomRuleError(f"signal {self.signal!r}: one of {', '.join(SIGNALS)}")
        if self.window < 1 or self.min_tokens < self.window:
            raise DoomRuleError(f"window {self.window}, min_tokens {self.min_tokens}: need 1 <= window <= min_tokens")

    @property
    def caps_length(self) -> bool:
        """A length rule: every sample still running at ``min_tokens`` is stopped there."""
        return self.threshold == math.inf

    @property
    def logprobs(self) -> int | None:
        """The top log-probabilities a request must return for the signal (0: the sampled
        token's; None: none, a length rule reads no signal, and vLLM then computes none)."""
        if self.caps_length:
            return None
        return TOP_LOGPROBS if self.signal == "confidence" else 0

    @property
    def identity(self) -> str:
        """What stopped a sample: the rule's own hash (of the fields that decide)."""
        decisive = {k: v for k, v in asdict(self).items() if k != "calibration"}
        digest = hashlib.sha256(json.dumps(decisive, sort_keys=True).encode()).hexdigest()
        return f"doom-rule@sha256:{digest}"

    def to_json(self) -> dict:
        out = asdict(self)
        out["threshold"] = None if self.caps_length else self.threshold  # JSON has no inf
        return out

    @classmethod
    def from_json(cls, data: dict) -> "DoomRule":
        try:
            threshold = data["threshold"]
            return cls(signal=data["signal"], window=int(data["window"]), min_tokens=int(data["min_tokens"]),
                       threshold=math.inf if threshold is None else float(threshold),
                       recall=float(data["recall"]), target=str(data["target"]),
                       calibration=dict(data.get("calibration") or {}))
        except (KeyError, TypeError, ValueError) as e:
            raise DoomRuleError(f"not a doom rule: {e}") from None

    def save(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "DoomRule":
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise DoomRuleError(f"{path}: {e}") from None
        if not isinstance(data, dict):
            raise DoomRuleError(f"{path}: not a doom rule (a JSON object)")
        return cls.from_json(data)

    def check_target(self, identity: str) -> None:
        """Refuse a rule calibrated on another target (its traces say nothing of this one's)."""
        if self.target.rsplit("@sha256:", 1)[-1] != identity.rsplit("@sha256:", 1)[-1]:
            raise DoomRuleError(f"the doom rule was calibrated on {self.target}, not on this target ({identity}); "
                                f"calibrate one for it (semjobs doom calibrate)")


def token_signal(signal: str, sampled_logprob: float, top_logprobs: Iterable[float]) -> float:
    """One generated token's value of ``signal`` (``top_logprobs``: the highest log-probabilities
    the engine returned for its position, the sampled token's among them or not)."""
    if signal == "logprob":
        return sampled_logprob
    top = sorted(top_logprobs, reverse=True)[:TOP_LOGPROBS]
    return -sum(top) / len(top) if top else 0.0


class DoomWatch:
    """One sample's running check: ``add`` each generated token's signal; ``doomed`` turns
    true at the token the rule stops it on, and stays. ``lowest``: the lowest windowed mean
    seen from ``min_tokens`` on (what calibration reads, in the same arithmetic)."""

    def __init__(self, rule: DoomRule):
        self.rule = rule
        self.values: deque[float] = deque(maxlen=rule.window)
        self.total = 0.0
        self.tokens = 0
        self.lowest = math.inf
        self.doomed = False

    def add(self, value: float) -> bool:
        if self.doomed:
            return True
        if len(self.values) == self.values.maxlen:
            self.total -= self.values[0]
        self.values.append(value)
        self.total += value
        self.tokens += 1
        if self.tokens >= self.rule.min_tokens:
            mean = self.total / len(self.values)
            self.lowest = min(self.lowest, mean)
            self.doomed = mean < self.rule.threshold
        return self.doomed


def stop_at(rule: DoomRule, values: Sequence[float]) -> int | None:
    """The number of tokens a sample with these per-token signals is stopped at, or None."""
    watch = DoomWatch(rule)
    for i, value in enumerate(values, start=1):
        if watch.add(value):
            return i
    return None


@dataclass(frozen=True)
class Trace:
    """A sample decoded to its end for calibration: its per-token signals and whether it was right."""

    signals: dict[str, list[float]]  # signal -> one value per generated token
    right: bool

    @property
    def tokens(self) -> int:
        return len(next(iter(self.signals.values()), []))


def _lowest_window_mean(values: Sequence[float], rule: DoomRule) -> float:
    """The lowest mean over the rule's window ending at its ``min_tokens`` or later (inf when
    the trace is shorter): the highest threshold that never stops it."""
    watch = DoomWatch(replace(rule, threshold=-math.inf))
    for value in values:
        watch.add(value)
    return watch.lowest


def allowed_stops(recall: float, right: int) -> int:
    """The most of ``right`` calibration traces a rule may stop while promising ``recall`` on
    unseen problems with PROMISE_CONFIDENCE: the largest k whose one-sided Clopper-Pearson
    upper bound on the stop rate is at most 1 - recall, i.e. P(X <= k) <= 1 - confidence for
    X ~ Binomial(right, 1 - recall). -1 when even k = 0 is too many: so few right traces back
    no such promise (a normal approximation's margin promised 95% on 24 right traces, all
    spared, and kept 87.5% on unseen ones)."""
    stop = 1 - recall
    p_k = recall ** right  # P(X = 0)
    cdf, k = p_k, 0
    while cdf <= 1 - PROMISE_CONFIDENCE and k < right:
        p_k *= (right - k) / (k + 1) * stop / recall  # P(X = k + 1)
        cdf += p_k
        k += 1
    return k - 1 if cdf > 1 - PROMISE_CONFIDENCE else right


def calibration_recall(recall: float, right: int) -> float:
    """The share of ``right`` calibration traces a rule must spare for ``recall`` to hold on
    unseen problems (``allowed_stops``); above 1 when none can back the promise."""
    return 1 - allowed_stops(recall, right) / max(right, 1)


def calibrate(traces: Sequence[Trace], recall: float, target: str, settings: dict | None = None,
              windows: Sequence[int] = WINDOWS, min_tokens: Sequence[int] = MIN_TOKENS,
              kinds: Sequence[str] = KINDS) -> DoomRule:
    """The rule of one of ``kinds`` that spares the most tokens of ``traces`` while sparing at
    least ``calibration_recall(recall, right traces)`` of the right ones (see the module). Its
    ``calibration`` says what the best rule of every kind would spare (``candidates``: each
    signal with a finite threshold, and a length cap), so that one sees what each is worth."""
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise DoomRuleError(f"rule kinds {list(kinds)}: choose among {', '.join(KINDS)}")
    if not 0 < recall < 1:
        raise DoomRuleError(f"recall {recall}: between 0 and 1")
    right = [t for t in traces if t.right]
    allowed = allowed_stops(recall, len(right))  # right traces it may stop
    if allowed < 0:
        least = math.ceil(math.log(1 - PROMISE_CONFIDENCE) / math.log(recall))
        raise DoomRuleError(f"{len(right)} right samples in the calibration: a promise of recall {recall} needs at "
                            f"least {least} (with none stopped); give more problems, more samples, easier ones "
                            "or a lower --recall")
    needed = 1 - allowed / len(right)
    total = sum(t.tokens for t in traces)
    best: tuple[float, DoomRule] | None = None
    candidates: dict[str, dict] = {}
    for signal in traces[0].signals:
        for window in windows:
            for least in (m for m in min_tokens if m >= window):
                probe = DoomRule(signal, window, least, -math.inf, recall, target)
                lows = sorted(_lowest_window_mean(t.signals[signal], probe) for t in right)
                # stop only below the lowest mean of the right traces it must spare
                threshold = lows[allowed]
                rule = DoomRule(signal, window, least, threshold, recall, target)
                stops = [stop_at(rule, t.signals[signal]) for t in traces]
                spared = sum(t.tokens - s for t, s in zip(traces, stops) if s is not None)
                kept = sum(s is None for t, s in zip(traces, stops) if t.right)
                figures = {"spared_share": round(spared / total, 4) if total else 0.0,
                           "recall": round(kept / len(right), 4)}
                kind = LENGTH if rule.caps_length else signal
                if kind not in candidates or figures["spared_share"] > candidates[kind]["spared_share"]:
                    candidates[kind] = {"window": window, "min_tokens": least,
                                        "threshold": None if rule.caps_length else round(threshold, 4), **figures}
                if kind in kinds and (best is None or spared > best[0]):
                    best = (spared, DoomRule(signal, window, least, threshold, recall, target, calibration={
                        "samples": len(traces), "right": len(right), "tokens": total, "spared_tokens": spared,
                        **figures, "recall_needed": round(needed, 4), **(settings or {})}))
    if best is None:  # only a length cap can be missing: no first token spares enough right traces
        raise DoomRuleError(f"no rule of the kinds {', '.join(kinds)} spares {needed:.1%} of the {len(right)} right "
                            "samples: the right ones run to the longest first token tried")
    chosen = best[1]
    return replace(chosen, calibration={**chosen.calibration, "candidates": candidates})
