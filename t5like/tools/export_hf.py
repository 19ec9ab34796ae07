"""Exports a t5like checkpoint as a Hugging Face model directory (no torch needed).

Usage::

  python -m t5like.tools.export_hf --workdir W [--step N] --output_dir D [--max_shard_mb 5000]

``D`` (local or ``gs://``) receives ``config.json`` (with ``auto_map``), the PyTorch modeling code
(``configuration_t5like.py``, ``modeling_t5like.py``, ``tokenization_t5like.py``, shipped in
``t5like/hf/``), the weights as
safetensors (``model.safetensors``, or shards with ``model.safetensors.index.json`` above
``--max_shard_mb``), ``generation_config.json`` and the SentencePiece tokenizer
(``tokenizer.model``, ``tokenizer_config.json``, ``special_tokens_map.json``) with the
vocabulary's own ids: pad 0, eos 1, unk 2, no extra ids. Load it with
``AutoModelForCausalLM`` (DecLLM) or ``AutoModelForSeq2SeqLM`` (RedLLM) and
``trust_remote_code=True`` (docs/hf.md).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
from typing import Any, Sequence

import numpy as np
from etils import epath

from t5like import cli, runtime
from t5like.config import Config
from t5like.config.model import ModelConfig
from t5like.config.schema import to_dict
from t5like.data import vocab as vocab_lib
from t5like.errors import UserError
from t5like.tools import hf_layout

HF_SOURCES = pathlib.Path(__file__).resolve().parent.parent / "hf"
CODE_FILES = ("configuration_t5like.py", "modeling_t5like.py", "tokenization_t5like.py")
WEIGHTS, INDEX = "model.safetensors", "model.safetensors.index.json"
AUTO_MAP = {
    "decllm": {"AutoConfig": "configuration_t5like.T5LikeConfig",
               "AutoModel": "modeling_t5like.DecLLMModel",
               "AutoModelForCausalLM": "modeling_t5like.DecLLMForCausalLM"},
    "redllm": {"AutoConfig": "configuration_t5like.T5LikeConfig",
               "AutoModel": "modeling_t5like.RedLLMModel",
               "AutoModelForSeq2SeqLM": "modeling_t5like.RedLLMForConditionalGeneration"},
}
ARCHITECTURES = {"decllm": "DecLLMForCausalLM", "redllm": "RedLLMForConditionalGeneration"}


class ExportError(UserError, ValueError):
  """A checkpoint or option the export cannot honour; the message says what to do."""


def hf_config(cfg: ModelConfig) -> dict[str, Any]:
  """config.json of ``cfg``: the t5like fields under their own names, the ids, ``auto_map``."""
  for field, only in hf_layout.UNSUPPORTED.items():
    if getattr(cfg, field) != only:
      raise ExportError(f"model.{field}={getattr(cfg, field)!r} has no Hugging Face "
                        f"implementation here; only {field}={only!r} exports")
  out = {f: getattr(cfg, f) for f in hf_layout.MODEL_FIELDS}
  encdec = cfg.family == "redllm"
  out.update({
      "model_type": "t5like", "architectures": [ARCHITECTURES[cfg.family]],
      "auto_map": AUTO_MAP[cfg.family], "is_encoder_decoder": encdec,
      "pad_token_id": vocab_lib.PAD_ID, "eos_token_id": vocab_lib.EOS_ID,
      # DecLLM rows start with id 0 (seqio's shifted decoder input), RedLLM's decoder too.
      "bos_token_id": 0, "tie_word_embeddings": cfg.tie_embeddings,
      "dtype": "float32"})
  if encdec:
    out["decoder_start_token_id"] = 0
  return out


def generation_config(cfg: ModelConfig) -> dict[str, Any]:
  out = {"bos_token_id": 0, "eos_token_id": vocab_lib.EOS_ID, "pad_token_id": vocab_lib.PAD_ID}
  if cfg.family == "redllm":
    out["decoder_start_token_id"] = 0
  return out


def tokenizer_files(family: str) -> dict[str, Any]:
  """tokenizer_config.json and special_tokens_map.json of ``t5like/hf/tokenization_t5like.py``:
  the SentencePiece model's own ids (pad 0, eos 1, unk 2). A DecLLM tokenizer puts its BOS (id 0,
  the ``<pad>`` piece: seqio's shifted decoder input starts every row with 0) in front of each
  text, as the training rows had it; a RedLLM tokenizer adds nothing (the model adds the
  decoder start token)."""
  decllm = family == "decllm"
  special = {"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>"}
  if decllm:
    special["bos_token"] = "<pad>"
  config = {
      "tokenizer_class": "T5LikeTokenizer",
      "auto_map": {"AutoTokenizer": ["tokenization_t5like.T5LikeTokenizer", None]},
      "special_tokens_pattern": "bos" if decllm else "none", "legacy": True,
      "clean_up_tokenization_spaces": False, "model_max_length": 1_000_000_000,
      "padding_side": "left" if decllm else "right", **special}
  return {"tokenizer_config.json": config, "special_tokens_map.json": special}


def model_card(cfg: ModelConfig) -> str:
  """README.md of the exported directory: what the model is and how to load and evaluate it."""
  seq2seq = cfg.family == "redllm"
  auto = "AutoModelForSeq2SeqLM" if seq2seq else "AutoModelForCausalLM"
  kind = ("RedLLM, the revisited encoder-decoder of arXiv 2510.26622" if seq2seq else
          "DecLLM, the decoder-only baseline of arXiv 2510.26622"
          + (" (bidirectional over the prompt)" if cfg.decoder_attention == "prefix" else ""))
  return f"""---
library_name: transformers
tags: [t5like, {cfg.family}]
---
# {cfg.family} exported from t5like

{kind}, trained with t5like and exported by `python -m t5like.tools.export_hf`. The model code
ships in this directory: load it with `trust_remote_code=True`.

```python
from transformers import {auto}, AutoTokenizer
tok = AutoTokenizer.from_pretrained(PATH, trust_remote_code=True)
model = {auto}.from_pretrained(PATH, trust_remote_code=True)
```

lm-evaluation-harness: `lm_eval --model hf --model_args pretrained=PATH,trust_remote_code=True\
{",backend=seq2seq" if seq2seq else ""} --tasks ...`

d_model {cfg.d_model}, {cfg.num_heads} heads ({cfg.kv_heads} key/value), head_dim {cfg.head_dim},
d_ff {cfg.d_ff}, {f"{cfg.num_encoder_layers} + {cfg.num_decoder_layers}" if seq2seq
                   else cfg.num_layers} layers, vocabulary {cfg.vocab_size} (SentencePiece).
"""


def _write_json(path: epath.Path, obj: Any) -> None:
  path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def write_weights(tensors: dict[str, np.ndarray], out: epath.Path, max_shard_bytes: int) -> list[str]:
  """safetensors file(s) of ``tensors`` (numpy API, ``format=pt`` metadata as transformers
  expects); shards of at most ``max_shard_bytes`` (a larger single tensor gets its own) and an
  index when more than one. Returns the file names written."""
  from safetensors.numpy import save
  shards: list[dict[str, np.ndarray]] = [{}]
  size = 0
  for name in sorted(tensors):
    a = tensors[name]
    if shards[-1] and size + a.nbytes > max_shard_bytes:
      shards.append({})
      size = 0
    shards[-1][name] = a
    size += a.nbytes
  if len(shards) == 1:
    names = [WEIGHTS]
  else:
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    _write_json(out / INDEX, {
        "metadata": {"total_size": int(sum(a.nbytes for a in tensors.values()))},
        "weight_map": {k: n for n, shard in zip(names, shards) for k in sorted(shard)}})
  for name, shard in zip(names, shards):
    (out / name).write_bytes(save(shard, metadata={"format": "pt"}))
  return names


def export(params: dict[str, Any], cfg: Config, output_dir: str, *,
           max_shard_bytes: int = 5 * 10**9) -> epath.Path:
  """Writes the HF directory of ``params`` (a nested dict of arrays) with ``cfg``."""
  model_cfg = cfg.model
  config = hf_config(model_cfg)
  tensors = {k: v.astype(np.float32) if v.dtype != np.float32 else v
             for k, v in hf_layout.to_hf(params, model_cfg).items()}
  out = epath.Path(output_dir)
  out.mkdir(parents=True, exist_ok=True)
  _write_json(out / "config.json", config)
  _write_json(out / "generation_config.json", generation_config(model_cfg))
  (out / "README.md").write_text(model_card(model_cfg))
  for name in CODE_FILES:
    (out / name).write_text((HF_SOURCES / name).read_text())
  write_weights(tensors, out, max_shard_bytes)
  (out / "tokenizer.model").write_bytes(vocab_lib.load_model_proto(cfg.data.vocab_path))
  for name, obj in tokenizer_files(model_cfg.family).items():
    _write_json(out / name, obj)
  return out


def check_vocabulary(cfg: Config) -> None:
  n = vocab_lib.vocab_size(cfg.data.vocab_path)
  if n != cfg.model.vocab_size:
    raise ExportError(f"the vocabulary {cfg.data.vocab_path or '(embedded)'} has {n} pieces but "
                      f"model.vocab_size={cfg.model.vocab_size}; the exported tokenizer must "
                      "cover the model's ids exactly")


def export_checkpoint(workdir: str, output_dir: str, *, step: int | None = None,
                      max_shard_bytes: int = 5 * 10**9) -> epath.Path:
  """Restores ``workdir``'s checkpoint (``step`` or the newest) and exports it."""
  from flax import nnx
  from t5like.training.restore import restore_model
  model, cfg, _ = restore_model(workdir, step=step)
  check_vocabulary(cfg)
  hf_config(cfg.model)  # Refuses what cannot export before anything is written.
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  return export(params, cfg, output_dir, max_shard_bytes=max_shard_bytes)


def build_parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="python -m t5like.tools.export_hf",
                              description=__doc__.split("\n\n")[0])
  p.add_argument("--workdir", required=True, help="a train.py workdir (or checkpoints/<step>)")
  p.add_argument("--step", type=int, default=None, help="checkpoint step (default: newest)")
  p.add_argument("--output_dir", required=True, help="the HF model directory (local or gs://)")
  p.add_argument("--max_shard_mb", type=int, default=5000,
                 help="largest safetensors file in MB before the weights are sharded")
  return p


def main(argv: Sequence[str] | None = None) -> int:
  parser = build_parser()
  cli.add_debug_argument(parser)
  args = parser.parse_args(argv)
  runtime.init_tensorflow()  # Quiet start (the vocabulary helpers sit beside seqio / TF).
  out = export_checkpoint(args.workdir, args.output_dir, step=args.step,
                          max_shard_bytes=args.max_shard_mb * 10**6)
  print(out)
  return 0


if __name__ == "__main__":
  sys.exit(cli.guard(main))
