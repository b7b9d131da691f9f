"""The embedded draft head's artifact (head.safetensors + head.json), see docs/draft.md."""
