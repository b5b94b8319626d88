"""The decoding pipeline: generate (and, later, validate and repair)."""
