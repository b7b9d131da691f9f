"""SemanticSpec decoding engine: pure torch + transformers, no service code inside."""
