"""Hand-written kernels where XLA has no fast one (each with an XLA fallback)."""
