"""semjobs: bulk chain-of-thought generation with SemanticSpec decoding."""

__version__ = "0.1.0"
