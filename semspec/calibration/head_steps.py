"""Calibration with a draft head (``semspec.head``): its sampled steps and its states over
steps, computed as the engine computes them when the head drafts.

After a prefix the head has read the prompt and the trace with the target's states (position
j reads the target's state at j-1) and predicts from the prefix's last token on; then it reads
each step token with its own predicted state of the position before -- in the engine the
target has not run a step's tokens while the head drafts it. The pooled states a draft probe
reads are the head's predicted states at the step's positions. (A step that starts with the
target's bonus token, after an accepted one, has the head read the target's state before
that token in the engine; calibration prefixes end where the target wrote, and are cut so.)
"""

from __future__ import annotations

from typing import Sequence

import torch

from semspec.probes import pool
from semspec.runner import Feed, ModelRunner


class HeadStepper:
    """``n`` copies of one prefix on a head, advanced token by token on chosen rows."""

    def __init__(self, head, target, prefix_ids: Sequence[int], n: int):
        if target is None:
            raise ValueError("a draft head needs its target's states: pass target=")
        prefix = list(prefix_ids)
        t_runner = ModelRunner(target, 1)
        states = t_runner.forward([Feed(t_runner.alloc(), prefix, states=True)]).states[0]
        reads = torch.cat([states.new_zeros(1, states.shape[1]), states[:-1]])
        self.runner = ModelRunner(head, n)
        self.slots = [self.runner.alloc() for _ in range(n)]
        out = self.runner.forward([Feed(s, prefix, [len(prefix) - 1], states=True, head_inputs=reads)
                                   for s in self.slots])
        self.logits = out.logits  # [n, V]: one row per copy, all equal
        self.states = torch.stack([st[-1] for st in out.states])  # [n, H] predicted state at the last position

    def advance(self, feed: dict[int, int]) -> torch.Tensor:
        """Feed token ``feed[row]`` to each given row; returns the logits of every row (rows
        not fed keep theirs) and updates ``states``."""
        rows = sorted(feed)
        out = self.runner.forward([Feed(self.slots[r], [feed[r]], [0], states=True, head_inputs=self.states[r:r + 1])
                                   for r in rows])
        logits = self.logits.clone()
        for k, r in enumerate(rows):
            logits[r] = out.logits[k]
            self.states[r] = out.states[k][0]
        self.logits = logits
        return logits


@torch.inference_mode()
def head_step_features(head, target, prefix_ids: Sequence[int], steps: Sequence[Sequence[int]],
                       pooling: str = "mean") -> torch.Tensor:
    """The head's predicted states pooled over each step's tokens after ``prefix_ids`` ->
    ``[len(steps), H]`` float32."""
    if any(len(s) == 0 for s in steps):
        raise ValueError("head_step_features got an empty step")
    stepper = HeadStepper(head, target, prefix_ids, len(steps))
    width = max(len(s) for s in steps)
    rows = stepper.states.new_zeros(len(steps), width, stepper.states.shape[1])
    mask = stepper.states.new_zeros(len(steps), width)
    for i in range(width):
        live = {r: int(s[i]) for r, s in enumerate(steps) if i < len(s)}
        stepper.advance(live)
        for r in live:
            rows[r, i] = stepper.states[r]
            mask[r, i] = 1
    return pool(rows, mask, pooling).cpu()
