"""Data pipeline: vocabulary, sources, seqio tasks, objectives and feature converters."""
