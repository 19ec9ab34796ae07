"""Evaluation: held-out loss / perplexity / token accuracy of a checkpoint, per task."""
