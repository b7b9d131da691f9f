"""Every default of draft training in one place."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from semspec.assets import GSM8K_TEST
from semspec.types import SAMPLING_TEMPERATURE, SAMPLING_TOP_P


@dataclass
class DraftTrainConfig:
    seed: int = 0
    # Architecture: the target's first `frozen_layers` layers are shared (frozen); then
    # `adapter_layers` trained layers, initialised from the target layers in `adapter_init`
    # (default: the target's last layers, which already map into the LM head's space).
    frozen_layers: int = 3
    adapter_layers: int = 1
    adapter_init: list[int] | None = None  # target layer indices; None -> the last ones
    # Data: GSM8K-style JSONL ({"question", "answer"}); the first `holdout` lines are the
    # benchmark slice and are never trained on.
    data: str = str(GSM8K_TEST)
    holdout: int = 100
    gen_prompts: int = 384  # questions the target answers greedily (on-policy text)
    # the first `sampled_prompts` questions are also answered `sampled_answers` times each at
    # the bench's sampling, decoded by vLLM: the draft then also learns the target where a
    # sampled job's answers go, off its greedy path. 0: greedy answers only (the shipped v2).
    sampled_prompts: int = 0
    sampled_answers: int = 1
    sample_temperature: float = SAMPLING_TEMPERATURE
    sample_top_p: float = SAMPLING_TOP_P
    ref_prompts: int = 384  # further questions (after the answered ones) teacher-forced on their reference solutions
    max_new_tokens: int = 192
    gen_batch_size: int = 32
    teacher_batch_size: int = 8
    eval_fraction: float = 0.125  # of the greedily answered questions, held out with all their answers
    # Distillation targets: the teacher's top-k next-token logits at every response position.
    teacher_topk: int = 32
    temperature: float = 1.0
    # Reduced vocabulary (FR-Spec): the draft predicts only the `draft_vocab` tokens the
    # target uses most on the training text; its LM head shrinks accordingly, which matters
    # once the draft has few layers (the full head costs as much as ~5 layers). 0: full.
    draft_vocab: int = 8192
    # Optimisation.
    steps: int = 1000
    batch_size: int = 8  # sequences per step
    lr: float = 1.5e-3
    weight_decay: float = 0.0
    warmup_steps: int = 10
    threads: int = 1
    eval_every: int = 0
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.sampled_prompts < 0 or self.sampled_answers < 1:
            raise ValueError("sampled_prompts must be at least 0 and sampled_answers at least 1")

    @property
    def answered_prompts(self) -> int:
        """Questions the target answers (greedily, sampled or both); the references follow them."""
        return max(self.gen_prompts, self.sampled_prompts)

    def resolved_adapter_init(self, target_layers: int) -> list[int]:
        if self.adapter_init is not None:
            if len(self.adapter_init) != self.adapter_layers:
                raise ValueError("adapter_init must name one target layer per adapter layer")
            return list(self.adapter_init)
        return list(range(target_layers - self.adapter_layers, target_layers))

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class HeadTrainConfig:
    """Training of an EAGLE-style draft head (``semjobs draft train --kind eagle``)."""

    seed: int = 0
    # Data: GSM8K-style JSONL; the first `holdout` lines (the benchmark slice) are never used.
    # The first `greedy_prompts` questions after it are answered greedily by the target, the
    # first `sampled_prompts` `sampled_answers` times each at the bench's sampling (with other
    # seeds), so the head sees the target's distribution and not one path through it. The
    # questions run out (GSM8K's test split is all there is here), answers do not.
    data: str = str(GSM8K_TEST)
    holdout: int = 100
    greedy_prompts: int = 480
    sampled_prompts: int = 768
    sampled_answers: int = 1
    # the next `reference_prompts` questions' reference solutions, teacher-forced: more text
    # under the target's distribution, at no generation cost (lines 869-1060; the head's
    # probe calibration uses the questions after them)
    reference_prompts: int = 192
    # also learn the target's next-token distribution over the prompt (the question), not
    # only over the answer: more positions against over-fitting a small set of answers
    prompt_loss: bool = True
    temperature: float = SAMPLING_TEMPERATURE
    top_p: float = SAMPLING_TOP_P
    max_new_tokens: int = 256
    gen_batch_size: int = 32
    eval_fraction: float = 0.1  # of each kind of trace, held out for evaluation
    # Head: a linear fusion of (target state at t, embedding of token t+1), `layers` decoder
    # layers initialised from the target's last ones, a final norm; logits through the
    # target's LM head rows for the reduced vocabulary of the shipped draft (FR-Spec).
    layers: int = 1
    # Optimisation. Loss = cross-entropy against the target's next-token distribution (over
    # the reduced vocabulary) + reg_weight * smooth-L1 of the predicted state on the target's.
    # The learning-rate schedule's length. 2400: at 1200 the head under-fitted (its held-out
    # score still rising); at 2400 the score flattens from about step 1400 (docs/draft.md).
    steps: int = 2400
    # The run ends after this step of the schedule (None: at its end). 1800: the step whose
    # weights the shipped head's 2400-step build kept (none of its later scores was higher),
    # so stopping there gives the same head 13 minutes sooner (docs/draft.md). A config with
    # other `steps` says its own stop; `semjobs draft train --steps N` alone runs all N.
    stop_after: int | None = 1800
    batch_size: int = 8  # sequences per step
    lr: float = 1e-3
    warmup_steps: int = 20
    reg_weight: float = 1.0
    # uniform noise added to the target states the head reads while training, so it stays
    # on course when it reads its own (imperfect) predictions while drafting (EAGLE)
    input_noise: float = 0.1
    # training-time test (EAGLE-3): the head is also trained on `unroll` - 1 further passes
    # that read its own predictions, as it does when it drafts several tokens; level m's loss
    # weighs unroll_decay ** (m - 1). 1: read the target's states only (EAGLE-1).
    unroll: int = 3
    unroll_decay: float = 0.8
    # "bfloat16": the matrix products run in bfloat16 under autocast (weights and optimiser
    # state stay float32): about 2x faster on a CPU with AMX, but about 23x slower than
    # float32 on one without bfloat16 instructions (both measured, docs/draft.md); "float32"
    # for exact arithmetic; "auto": bfloat16 where the CPU has those instructions, else
    # float32 (a build records which it used)
    train_dtype: str = "auto"
    threads: int = 2  # results depend on it: a bit-identical rebuild needs the same count
    eval_depths: tuple[int, ...] = (1, 2, 4, 8, 16)
    eval_stride: int = 8  # draft from every eval_stride-th response position
    # every `select_every` steps a quarter of the held-out traces scores the head (the mean
    # accepted length of a greedy verification of 6 drafted tokens) and the best weights so
    # far are kept (the artifact holds the best; 0: the last)
    select_every: int = 200

    def __post_init__(self):
        if self.train_dtype not in ("auto", "bfloat16", "float32"):
            raise ValueError(f"train_dtype must be auto, bfloat16 or float32, not {self.train_dtype!r}")
        if self.stop_after is not None and self.stop_after < 1:
            raise ValueError(f"stop_after must be at least 1 (or None: the whole schedule), not {self.stop_after}")
        if self.sampled_answers < 1:
            raise ValueError(f"sampled_answers must be at least 1, not {self.sampled_answers}")
        if self.unroll < 1:
            raise ValueError(f"unroll must be at least 1, not {self.unroll}")

    @property
    def last_step(self) -> int:
        """The step the run ends after: ``stop_after``, within the schedule."""
        return self.steps if self.stop_after is None else min(self.steps, self.stop_after)

    def to_dict(self) -> dict:
        return asdict(self)
