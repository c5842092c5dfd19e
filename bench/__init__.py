"""gemma4-bench: the measurement harness (sweeps, profiles, reports) around the `model` engine."""
