"""``generate``: greedy equals repeated full forwards, a Generator serves many calls from one
decode layout, sampling is reproducible and stays inside its top-k / top-p set, EOS stops one row
while the others go on, bad input is a clear error, an 8-device mesh generates what one device
does, and eval.py prints completions of a checkpoint.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from cli_scripts import load_script
from helpers import tiny_model
from t5like.inference import Generator, SamplingConfig, generate
from t5like.inference import generation as gen
from t5like.inference.sampling import sample

PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24], [30]]
NEW = 6
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MODELS = {
    "decllm_causal": ("decllm", dict(num_kv_heads=2)),
    "decllm_prefix": ("decllm", dict(decoder_attention="prefix")),
    "redllm": ("redllm", dict()),
}


@pytest.fixture(scope="module", params=list(MODELS))
def model(request):
  family, overrides = MODELS[request.param]
  return tiny_model(family, seed=3, **overrides)


def reference_greedy(model, prompt: list[int], new: int) -> list[int]:
  """Argmax of one full training-style forward per new token (no cache), fixed length 32."""
  forward = nnx.jit(lambda mdl, b: mdl(b))
  out: list[int] = []
  for _ in range(new):
    if model.cfg.family == "redllm":
      enc, dec = np.zeros((1, 32), np.int32), np.zeros((1, 32), np.int32)
      enc[0, :len(prompt)] = prompt
      dec[0, 1:1 + len(out)] = out  # BOS (0), then the tokens so far.
      logits = forward(model, {"encoder_input_tokens": jnp.asarray(enc),
                               "decoder_input_tokens": jnp.asarray(dec)})
      at = len(out)
    else:
      seq = [0] + prompt + out
      rows = {k: np.zeros((1, 32), np.int32) for k in
              ("decoder_input_tokens", "decoder_segment_ids", "decoder_causal_attention")}
      rows["decoder_input_tokens"][0, :len(seq)] = seq
      rows["decoder_segment_ids"][0, :len(seq)] = 1
      rows["decoder_causal_attention"][0, :len(prompt) + 1] = 1  # PrefixLM: BOS + prompt.
      logits = forward(model, {k: jnp.asarray(v) for k, v in rows.items()})
      at = len(seq) - 1
    out.append(int(np.argmax(np.asarray(logits)[0, at])))
  return out


def test_prompts_round_up_to_16_then_take_bos():
  """DecLLM rows are BOS + prompt, left-padded to 16k + 1 (a 16-token prompt prefills 17
  positions, not 32); RedLLM prompts are right-padded to 16k."""
  from t5like.inference.generation import _pad_inputs
  tokens, lens = _pad_inputs([[5] * 16, [7] * 3], "decllm", 3)
  assert tokens.shape == (3, 17) and lens.tolist() == [17, 4, 17]  # Row 3: filler.
  assert tokens[0].tolist() == [0] + [5] * 16
  assert tokens[1].tolist() == [0] * 13 + [0, 7, 7, 7]
  tokens, lens = _pad_inputs([[5] * 17], "decllm", 1)
  assert tokens.shape == (1, 33)
  tokens, lens = _pad_inputs([[5] * 16, [7] * 3], "redllm", 2)
  assert tokens.shape == (2, 16) and lens.tolist() == [16, 3]
  assert tokens[1].tolist() == [7, 7, 7] + [0] * 13


def test_greedy_equals_argmax_of_full_forwards(model):
  got = generate(model, PROMPTS, max_new_tokens=NEW, eos_id=-1)
  want = [reference_greedy(model, p, NEW) for p in PROMPTS]
  assert got == want


def test_eos_stops_one_row_while_the_others_continue(model):
  full = generate(model, PROMPTS, max_new_tokens=NEW, eos_id=-1)
  # An "EOS" that row 0 produces early and some other row never produces.
  eos = next(t for t in full[0][:NEW - 1]
             if any(t not in row for row in full[1:]))
  cut = generate(model, PROMPTS, max_new_tokens=NEW, eos_id=eos)
  for row_full, row_cut in zip(full, cut):
    want = row_full[:row_full.index(eos)] if eos in row_full else row_full
    assert row_cut == want
  assert len(cut[0]) < NEW and max(len(r) for r in cut[1:]) == NEW


def test_sampling_is_reproducible_and_top_k_1_is_greedy(model):
  hot = SamplingConfig(temperature=1.0)
  a = generate(model, PROMPTS, max_new_tokens=NEW, eos_id=-1, sampling=hot, rng=jax.random.key(7))
  b = generate(model, PROMPTS, max_new_tokens=NEW, eos_id=-1, sampling=hot, rng=jax.random.key(7))
  c = generate(model, PROMPTS, max_new_tokens=NEW, eos_id=-1, sampling=hot, rng=jax.random.key(8))
  assert a == b and a != c
  greedy = generate(model, PROMPTS, max_new_tokens=NEW, eos_id=-1)
  top1 = generate(model, PROMPTS, max_new_tokens=NEW, eos_id=-1,
                  sampling=SamplingConfig(temperature=2.0, top_k=1), rng=jax.random.key(7))
  assert top1 == greedy


def test_a_generator_serves_many_calls_from_one_decode_layout(model, monkeypatch):
  made = []
  real = gen._decode_layout
  monkeypatch.setattr(gen, "_decode_layout", lambda m: made.append(1) or real(m))
  generator = Generator(model)
  shorter = [p[:10] for p in PROMPTS]  # Another padded width (16, not 32): another plan.
  assert generator(PROMPTS, max_new_tokens=NEW, eos_id=-1) == generate(model, PROMPTS,
                                                                      max_new_tokens=NEW,
                                                                      eos_id=-1)
  assert generator(shorter, max_new_tokens=3, eos_id=-1) == [
      reference_greedy(model, p, 3) for p in shorter]
  assert generator(PROMPTS[:1], max_new_tokens=NEW, eos_id=-1) == [
      reference_greedy(model, PROMPTS[0], NEW)]
  assert len(made) == 2  # The Generator's one layout, and generate()'s own.


def test_sampler_keeps_to_its_top_k_and_top_p_sets():
  # probabilities 0.5, 0.25, 0.125, 0.0625, ... over 8 tokens.
  logits_bv = jnp.log(jnp.asarray([[2.0 ** -(i + 1) for i in range(8)]] * 512))
  keys = jax.random.split(jax.random.key(0), 3)
  k2 = np.asarray(sample(logits_bv, keys[0], SamplingConfig(1.0, top_k=2)))
  assert set(k2.tolist()) == {0, 1}
  # top_p=0.7: {0.5, 0.25} is the smallest set with mass >= 0.7.
  p7 = np.asarray(sample(logits_bv, keys[1], SamplingConfig(1.0, top_p=0.7)))
  assert set(p7.tolist()) == {0, 1}
  free = np.asarray(sample(logits_bv, keys[2], SamplingConfig(1.0)))
  assert len(set(free.tolist())) >= 5
  # Unrestricted sampling follows the distribution: token 0 about half the time.
  assert abs(np.mean(free == 0) - 0.5) < 0.08


@pytest.mark.parametrize("kwargs, message", [
    (dict(prompts=[[5] * 40], max_new_tokens=10, max_length=48), "max_length=48"),
    (dict(prompts=[[5], []], max_new_tokens=4), "prompt 1 is empty"),
    (dict(prompts=[[5]], max_new_tokens=0), "max_new_tokens must be >= 1"),
    (dict(prompts=[[5, 200]], max_new_tokens=2), "outside [1, 97)"),
    (dict(prompts=[[5]], max_new_tokens=2, sampling=SamplingConfig(temperature=1.0)), "rng"),
    (dict(prompts=[[5]], max_new_tokens=2, sampling=SamplingConfig(top_p=0.0)), "top_p"),
])
def test_bad_input_is_a_clear_error(kwargs, message):
  mdl = tiny_model("decllm")
  with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(")
                     .replace(")", r"\)")):
    generate(mdl, **kwargs)


MESH_SCRIPT = r"""
import json, sys
import jax
sys.path.insert(0, "tests/models")
from helpers import tiny_model
from t5like import partitioning
from t5like.config.train import MeshConfig
from t5like.inference import Generator, SamplingConfig, generate
assert jax.device_count() == 8
prompts = [[5, 6, 7], list(range(8, 25)), [30]]
out = {}
for family in ("decllm", "redllm"):
  model = tiny_model(family, seed=3, vocab_size=128, num_kv_heads=2)
  mesh = partitioning.make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
  on_mesh = Generator(model, mesh)  # One decode layout on the mesh for both calls.
  for name, kw in (("greedy", {}), ("sampled", dict(sampling=SamplingConfig(1.0, top_k=20),
                                                     rng=jax.random.key(1)))):
    one = generate(model, prompts, max_new_tokens=6, eos_id=-1, **kw)
    eight = on_mesh(prompts, max_new_tokens=6, eos_id=-1, **kw)
    out[f"{family}/{name}"] = [one, eight]
  out[f"{family}/generate"] = [one, generate(model, prompts, max_new_tokens=6, eos_id=-1,
                                             mesh=mesh, **kw)]
print("RESULT" + json.dumps(out))
"""


def test_generation_on_8_devices_equals_1_device():
  sys.path.insert(0, os.path.join(REPO, "tests", "training"))
  from train_helpers import run_script
  proc = run_script(MESH_SCRIPT, devices=8)
  result = json.loads(proc.stdout.split("RESULT", 1)[1])
  assert set(result) == {f"{f}/{n}" for f in ("decllm", "redllm")
                         for n in ("greedy", "sampled", "generate")}
  for name, (one, eight) in result.items():
    assert one == eight, name
    assert all(len(row) == 6 for row in one), name


SMALL = ["model.d_model=32", "model.num_heads=2", "model.head_dim=16", "model.d_ff=64",
         "model.num_layers=1", "train.steps=2", "train.batch_size=4", "train.eval_steps=1",
         "train.eval_batch_size=4", "train.log_every=1", "train.progress_bar=false",
         "checkpoint.every=0"]


@pytest.mark.slow  # Trains a checkpoint and starts eval.py (generate itself is tested above).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # Orbax, shape mismatch.
def test_eval_py_prints_completions_of_a_checkpoint(tmp_path, capsys):
  from t5like.config import load_config
  from t5like.data.vocab import get_vocabulary
  from t5like.inference.checkpoint import load_model
  from t5like.training import run
  workdir = str(tmp_path / "redllm")
  run(load_config(os.path.join(REPO, "configs", "tiny_redllm.py"), SMALL), workdir)
  prompts = tmp_path / "prompts.txt"
  prompts.write_text("The capital of France is\n\nOnce upon a time\n")
  cmd = [sys.executable, os.path.join(REPO, "eval.py"), "--workdir", workdir, "--prompt",
         "Hello world", "--prompt_file", str(prompts), "--max_new_tokens", "5"]
  proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "--- [2] prompt: Once upon a time" in proc.stdout
  # What eval.py printed is what generate() gives for the same checkpoint.
  model, cfg, _ = load_model(workdir)
  vocab = get_vocabulary(cfg.data.vocab_path)
  want = generate(model, [list(vocab.encode("The capital of France is"))], max_new_tokens=5,
                  eos_id=vocab.eos_id)[0]
  block = proc.stdout.split("--- [1] prompt: The capital of France is\n", 1)[1]
  assert block.split("\n--- [2]", 1)[0] == vocab.decode(want)

  # Bad input, in-process (same main() as the command line).
  eval_cli = load_script("eval.py")
  assert eval_cli.main(cmd[2:-2] + ["--max_new_tokens", "0"]) == 2
  assert "max_new_tokens must be >= 1" in capsys.readouterr().err
  assert eval_cli.main(cmd[2:] + ["--config.model.d_model=64"]) == 2
  assert "does not match" in capsys.readouterr().err
