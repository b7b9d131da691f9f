"""Small files shipped with the engine: the embedded draft's trained weights, and the GSM8K
test split (MIT licence in gsm8k/LICENSE) used by default for calibration, draft training
and benchmarks, so a fresh install needs no other data."""

from pathlib import Path

GSM8K_TEST = Path(__file__).resolve().parent / "gsm8k" / "test.jsonl"
