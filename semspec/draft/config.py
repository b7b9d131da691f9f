"""Every default of draft training in one place."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from semspec.assets import GSM8K_TEST


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
    ref_prompts: int = 384  # further questions teacher-forced on their reference solutions
    max_new_tokens: int = 192
    gen_batch_size: int = 32
    teacher_batch_size: int = 8
    eval_fraction: float = 0.125  # of the generated sequences, held out for evaluation
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

    def resolved_adapter_init(self, target_layers: int) -> list[int]:
        if self.adapter_init is not None:
            if len(self.adapter_init) != self.adapter_layers:
                raise ValueError("adapter_init must name one target layer per adapter layer")
            return list(self.adapter_init)
        return list(range(target_layers - self.adapter_layers, target_layers))

    def to_dict(self) -> dict:
        return asdict(self)
