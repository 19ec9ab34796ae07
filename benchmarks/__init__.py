"""Benchmarks of t5like (run as scripts: ``python benchmarks/<name>.py``); ``timing`` holds what
they share."""
