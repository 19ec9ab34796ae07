"""Data pipeline: vocabulary, sources, seqio tasks, objectives and feature converters.

Modules (import the one you need; none loads seqio or TensorFlow at import time):
  vocab         SentencePiece vocabularies (T5 ids) and the embedded default.
  sources       jsonl(.zst) layouts, record checks with bad-record policy, tf.data shard reader.
  tfds_builder  local TFDS builders converting jsonl corpora once (no download).
  tasks         seqio task/mixture registry: embedded_redpajama, redpajama_v1, embedded_flan, flan.
  objectives    causal LM, prefix LM (middle/random split), instruction preprocessors.
  features      seqio feature converters + RedLLM continuous decoder positions.
  pipeline      make_iterator: sharded, deterministic, checkpointable numpy batches.
  host_shards   how hosts share a part's files, on the fly and from a cache.
  caching       seqio's offline cache of the tokenised corpora (built by tools/cache_data).
  validation    validation hold-out by document hash for parts without validation files.
  counts        record counts for mixing rates, cached next to the data.
  checks        start-up checks (layout, vocabulary size, validation data, shared TFDS).
"""
