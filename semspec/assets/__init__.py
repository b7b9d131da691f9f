"""Small files shipped with the engine (the embedded draft's trained weights)."""
