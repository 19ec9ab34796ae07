"""Hugging Face export without torch: the directory's files, config.json, safetensors names,
shapes and dtypes, every tensor equal to the checkpoint's in PyTorch's layout, sharding, the
import of an export bit-identical, and clean errors (``python -m t5like.tools.export_hf`` /
``import_hf``)."""
from __future__ import annotations

import json
import os
import sys

import jax
import numpy as np
import pytest
from flax import nnx
from safetensors import safe_open

from hf_helpers import make_export, tiny_config

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "training"))
from test_gcs_emulator import BUCKET, gcs  # noqa: E402,F401  (the emulator fixture)
from t5like.data import vocab as vocab_lib
from t5like.training.restore import restore_model
from t5like import cli
from t5like.tools import export_hf, import_hf

CODE = {"configuration_t5like.py", "modeling_t5like.py", "tokenization_t5like.py"}
TOKENIZER = {"tokenizer.model", "tokenizer_config.json", "special_tokens_map.json"}
ATTN = ["q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm", "v_norm"]
MLP = ["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
  return {"decllm": make_export(str(tmp_path_factory.mktemp("dec")), "decllm", num_kv_heads=2),
          "redllm": make_export(str(tmp_path_factory.mktemp("red")), "redllm", seed=1,
                                max_shard_bytes=200_000)}


def tensors(hf_dir: str) -> dict[str, np.ndarray]:
  files = [f for f in os.listdir(hf_dir) if f.endswith(".safetensors")]
  out = {}
  for name in files:
    with safe_open(os.path.join(hf_dir, name), framework="numpy") as f:
      assert f.metadata() == {"format": "pt"}  # What transformers' loader asks for.
      out.update({k: f.get_tensor(k) for k in f.keys()})
  return out


def expected_names(family: str, layers: int = 2) -> set[str]:
  def block(prefix, attn):
    return {f"{prefix}.{a}.{p}.weight" for a in attn for p in ATTN} | {
        f"{prefix}.{m}.weight" for m in MLP}
  names = {"model.embed_tokens.weight"}
  for i in range(layers):
    if family == "decllm":
      names |= block(f"model.layers.{i}", ["self_attn"]) | {
          f"model.layers.{i}.{n}.weight" for n in ("input_layernorm", "post_attention_layernorm")}
    else:
      e, d = f"model.encoder.layers.{i}", f"model.decoder.layers.{i}"
      names |= block(e, ["self_attn"]) | {f"{e}.self_attn.o_norm.weight"} | {
          f"{e}.{n}.weight" for n in ("input_layernorm", "post_attention_layernorm")}
      names |= block(d, ["self_attn", "cross_attn"]) | {
          f"{d}.{a}.o_norm.weight" for a in ("self_attn", "cross_attn")} | {
          f"{d}.{n}.weight" for n in ("self_attn_layernorm", "cross_attn_layernorm",
                                      "mlp_layernorm")}
  if family == "decllm":
    return names | {"model.norm.weight"}
  return names | {"model.encoder.norm.weight", "model.decoder.norm.weight"}


@pytest.mark.parametrize("family", ["decllm", "redllm"])
def test_directory_files_and_config(exports, family):
  _, hf_dir, _, cfg = exports[family]
  files = set(os.listdir(hf_dir))
  weights = {f for f in files if "safetensors" in f}
  assert files - weights == {"config.json", "generation_config.json", "README.md"} | CODE | \
      TOKENIZER
  card = open(os.path.join(hf_dir, "README.md")).read()
  assert ("backend=seq2seq" in card) == (family == "redllm") and "trust_remote_code" in card
  if family == "decllm":
    assert weights == {"model.safetensors"}
  else:  # 200 kB shards: several files and their index.
    assert "model.safetensors.index.json" in weights and len(weights) > 2
  config = json.loads(open(os.path.join(hf_dir, "config.json")).read())
  auto = "AutoModelForCausalLM" if family == "decllm" else "AutoModelForSeq2SeqLM"
  assert config["model_type"] == "t5like" and auto in config["auto_map"]
  assert config["auto_map"]["AutoConfig"] == "configuration_t5like.T5LikeConfig"
  assert config["is_encoder_decoder"] == (family == "redllm")
  assert (config["pad_token_id"], config["eos_token_id"]) == (0, 1)
  for field in ("family", "d_model", "num_heads", "head_dim", "d_ff", "num_kv_heads",
                "attn_out_norm", "rope_max_wavelength", "norm_eps", "continuous_positions"):
    assert config[field] == getattr(cfg.model, field), field
  generation = json.loads(open(os.path.join(hf_dir, "generation_config.json")).read())
  assert generation["eos_token_id"] == 1 and generation["pad_token_id"] == 0
  if family == "redllm":
    assert config["decoder_start_token_id"] == generation["decoder_start_token_id"] == 0
  with open(os.path.join(hf_dir, "tokenizer.model"), "rb") as f:
    assert f.read() == vocab_lib.load_model_proto("")
  tok = json.loads(open(os.path.join(hf_dir, "tokenizer_config.json")).read())
  assert tok["special_tokens_pattern"] == ("bos" if family == "decllm" else "none")
  assert (tok["pad_token"], tok["eos_token"], tok["unk_token"]) == ("<pad>", "</s>", "<unk>")


@pytest.mark.parametrize("family", ["decllm", "redllm"])
def test_tensor_names_shapes_and_dtypes(exports, family):
  _, hf_dir, _, cfg = exports[family]
  got = tensors(hf_dir)
  assert set(got) == expected_names(family)
  m = cfg.model
  kv = m.num_kv_heads or m.num_heads
  for name, a in got.items():
    assert a.dtype == np.float32, name
    if name.endswith(("q_proj.weight", "o_proj.weight")):
      want = (m.num_heads * m.head_dim, m.d_model)
      assert a.shape == (want if "q_proj" in name else want[::-1]), name
    elif name.endswith(("k_proj.weight", "v_proj.weight")):
      assert a.shape == (kv * m.head_dim, m.d_model), name
    elif name.endswith(("gate_proj.weight", "up_proj.weight")):
      assert a.shape == (m.d_ff, m.d_model), name
    elif name.endswith("down_proj.weight"):
      assert a.shape == (m.d_model, m.d_ff), name
    elif name.endswith(("q_norm.weight", "k_norm.weight", "v_norm.weight", "o_norm.weight")):
      assert a.shape == (m.head_dim,), name
    elif name == "model.embed_tokens.weight":
      assert a.shape == (m.vocab_size, m.d_model)
    else:
      assert a.shape == (m.d_model,), name


@pytest.mark.parametrize("family", ["decllm", "redllm"])
def test_every_tensor_is_the_checkpoints_in_torch_layout(exports, family):
  """nn.Linear computes x @ W^T: W^T must be the einsum kernel with its head axes flattened."""
  _, hf_dir, params, cfg = exports[family]
  got = tensors(hf_dir)
  m = cfg.model
  assert np.array_equal(got["model.embed_tokens.weight"], params["embedding"]["table"])
  stacks = ([("decoder", "model.layers", "attention", "self_attn")] if family == "decllm" else
            [("encoder", "model.encoder.layers", "attention", "self_attn"),
             ("decoder", "model.decoder.layers", "self_attention", "self_attn"),
             ("decoder", "model.decoder.layers", "cross_attention", "cross_attn")])
  for stack, hf, attn, hf_attn in stacks:
    layers = params[stack]["layers"]
    for i in range(2):
      a, pre = layers[attn], f"{hf}.{i}.{hf_attn}"
      for w in ("q", "k", "v"):
        kernel = a[f"w{w}"][i]  # [d, heads, head_dim]
        assert np.array_equal(got[f"{pre}.{w}_proj.weight"].T.reshape(kernel.shape), kernel)
        assert np.array_equal(got[f"{pre}.{w}_norm.weight"], a[f"{w}_norm"]["scale"][i])
      assert np.array_equal(got[f"{pre}.o_proj.weight"].T.reshape(a["wo"][i].shape), a["wo"][i])
      if m.attn_out_norm:
        assert np.array_equal(got[f"{pre}.o_norm.weight"], a["out_norm"]["scale"][i])
      mlp = layers["mlp"]
      for w, hf_w in (("wi_gate", "gate_proj"), ("wi_up", "up_proj"), ("wo", "down_proj")):
        assert np.array_equal(got[f"{hf}.{i}.mlp.{hf_w}.weight"].T, mlp[w][i])
  if family == "decllm":
    norms = {"model.norm.weight": params["final_norm"]["scale"],
             "model.layers.1.input_layernorm.weight":
                 params["decoder"]["layers"]["pre_attention_norm"]["scale"][1],
             "model.layers.1.post_attention_layernorm.weight":
                 params["decoder"]["layers"]["pre_mlp_norm"]["scale"][1]}
  else:
    dec = params["decoder"]["layers"]
    norms = {"model.encoder.norm.weight": params["encoder_norm"]["scale"],
             "model.decoder.norm.weight": params["decoder_norm"]["scale"],
             "model.decoder.layers.1.self_attn_layernorm.weight":
                 dec["pre_self_attention_norm"]["scale"][1],
             "model.decoder.layers.1.cross_attn_layernorm.weight":
                 dec["pre_cross_attention_norm"]["scale"][1],
             "model.decoder.layers.1.mlp_layernorm.weight": dec["pre_mlp_norm"]["scale"][1]}
  for name, want in norms.items():
    assert np.array_equal(got[name], want), name


def test_shard_index_names_every_tensor_once(exports):
  _, hf_dir, _, _ = exports["redllm"]
  index = json.loads(open(os.path.join(hf_dir, "model.safetensors.index.json")).read())
  by_file = {}
  for name, file in index["weight_map"].items():
    by_file.setdefault(file, set()).add(name)
  got = tensors(hf_dir)
  assert set(index["weight_map"]) == set(got)
  for file, names in by_file.items():
    with safe_open(os.path.join(hf_dir, file), framework="numpy") as f:
      assert set(f.keys()) == names
  assert index["metadata"]["total_size"] == sum(a.nbytes for a in got.values())


@pytest.mark.parametrize("family", ["decllm", "redllm"])
def test_import_of_export_is_bit_identical(exports, tmp_path, family):
  _, hf_dir, params, cfg = exports[family]
  step_dir = import_hf.import_dir(hf_dir, str(tmp_path))
  model, restored_cfg, _ = restore_model(step_dir)
  assert restored_cfg.model.family == family
  assert restored_cfg.data.vocab_path.endswith("spm.model")
  for f in ("d_model", "num_kv_heads", "attn_out_norm", "qkv_norm", "v_norm", "tie_embeddings",
            "scale_logits", "rope_max_wavelength"):
    assert getattr(restored_cfg.model, f) == getattr(cfg.model, f), f
  back = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  flat, want = jax.tree_util.tree_flatten_with_path(back)[0], dict(
      jax.tree_util.tree_flatten_with_path(params)[0])
  assert len(flat) == len(want)
  for path, a in flat:
    assert np.array_equal(np.asarray(a), want[path]) and a.dtype == want[path].dtype, path


def test_what_cannot_export_or_import_is_a_clean_error(tmp_path, capsys):
  with pytest.raises(export_hf.ExportError, match="mixed_attention"):
    export_hf.hf_config(tiny_config("redllm", mixed_attention="per_head").model)
  with pytest.raises(export_hf.ExportError, match="shared_encoder_decoder"):
    export_hf.hf_config(tiny_config("redllm", shared_encoder_decoder=True).model)
  assert cli.guard(export_hf.main, ["--workdir", str(tmp_path / "none"), "--output_dir",
                                    str(tmp_path / "out")]) == 2
  assert "error: no checkpoint found" in capsys.readouterr().err
  (tmp_path / "gpt2").mkdir()
  (tmp_path / "gpt2" / "config.json").write_text('{"model_type": "gpt2"}')
  assert cli.guard(import_hf.main, ["--hf_dir", str(tmp_path / "gpt2"), "--workdir",
                                    str(tmp_path)]) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: model_type='gpt2'") and "llama" in err


def test_an_imported_checkpoint_starts_a_finetuning_run(exports, tmp_path, capsys):
  """``train.init_from`` takes the imported parameters (with the overrides import_hf prints)."""
  from t5like.config import Config, apply_overrides
  from t5like.training import loop
  from t5like.training.data import SyntheticData
  _, hf_dir, _, _ = exports["decllm"]
  imported = tmp_path / "imported"
  assert cli.guard(import_hf.main, ["--hf_dir", hf_dir, "--workdir", str(imported)]) == 0
  hint = capsys.readouterr().err.strip().splitlines()[-1]
  assert hint.startswith(f"fine-tune with: --config.train.init_from={imported} ")
  cfg = Config()
  apply_overrides(cfg, [a[len("--config."):] for a in hint.split()[2:]])
  cfg.data.mixture, cfg.data.sequence_length = "embedded_redpajama", 16
  cfg.train.steps, cfg.train.batch_size, cfg.train.eval_every = 1, 2, 0
  cfg.train.progress_bar, cfg.checkpoint.every = False, 0
  result = loop.run(cfg.validate(), str(tmp_path / "run"), data=SyntheticData(cfg))
  assert result["step"] == 1
  with open(tmp_path / "run" / "train.log") as f:
    assert "initialised parameters from" in f.read()


def test_export_to_and_import_from_a_bucket(exports, gcs, tmp_path):
  """``--output_dir gs://...`` and ``--hf_dir gs://...`` (a local GCS emulator)."""
  from etils import epath
  workdir, local_dir, params, _ = exports["redllm"]
  url = f"gs://{BUCKET}/hf/redllm"
  export_hf.export_checkpoint(workdir, url, max_shard_bytes=200_000)
  assert sorted(p.name for p in epath.Path(url).iterdir()) == sorted(os.listdir(local_dir))
  model, _, _ = restore_model(import_hf.import_dir(url, str(tmp_path)))
  back = jax.tree_util.tree_leaves(nnx.to_pure_dict(nnx.state(model, nnx.Param)))
  assert all(np.array_equal(np.asarray(a), b) for a, b in zip(back, jax.tree_util.tree_leaves(
      params)))
