"""``eval.py --prompt``: print completions of a checkpoint (the generation mode of eval.py)."""
from __future__ import annotations

import argparse
from typing import Sequence

from t5like import cli

HELP = {
    "prompt": "generate: a prompt (repeatable); RedLLM reads it with its encoder",
    "prompt_file": "generate: a text file with one prompt per line",
    "max_new_tokens": "generate: most new tokens per prompt",
    "temperature": "generate: 0 = greedy (default); > 0 samples",
    "top_k": "generate: sample from the k most likely tokens (0 = all)",
    "top_p": "generate: sample from the smallest set with probability >= p",
    "seed": "generate: PRNG seed for sampling",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("--prompt", action="append", default=[], help=HELP["prompt"])
  parser.add_argument("--prompt_file", default="", help=HELP["prompt_file"])
  parser.add_argument("--max_new_tokens", type=int, default=32, help=HELP["max_new_tokens"])
  parser.add_argument("--temperature", type=float, default=0.0, help=HELP["temperature"])
  parser.add_argument("--top_k", type=int, default=0, help=HELP["top_k"])
  parser.add_argument("--top_p", type=float, default=1.0, help=HELP["top_p"])
  parser.add_argument("--seed", type=int, default=0, help=HELP["seed"])


def wants_generation(args: argparse.Namespace) -> bool:
  return bool(args.prompt or args.prompt_file)


def read_prompts(args: argparse.Namespace) -> list[str]:
  prompts = list(args.prompt)
  if args.prompt_file:
    from etils import epath
    path = epath.Path(args.prompt_file)
    if not path.exists():
      raise FileNotFoundError(f"--prompt_file {args.prompt_file} does not exist")
    prompts += [line for line in path.read_text().splitlines() if line.strip()]
  if not prompts:
    raise ValueError(f"no prompts: --prompt_file {args.prompt_file} has no non-empty line")
  return prompts


def run(args: argparse.Namespace, overrides: Sequence[str] = ()) -> int:
  """Loads the checkpoint, generates for every prompt, prints prompt and completion."""
  import jax
  from t5like import partitioning
  from t5like.config import ConfigError
  from t5like.data.vocab import get_vocabulary
  from t5like.inference.checkpoint import load_model
  from t5like.inference.generation import generate
  from t5like.inference.sampling import SamplingConfig
  try:
    prompts = read_prompts(args)
    sampling = SamplingConfig(args.temperature, args.top_k, args.top_p).validate()
    model, cfg, step_dir = load_model(args.workdir[0], step=args.step, overrides=overrides)
    vocab = get_vocabulary(cfg.data.vocab_path)
    ids = [list(vocab.encode(p)) for p in prompts]
    outs = generate(model, ids, max_new_tokens=args.max_new_tokens, eos_id=vocab.eos_id,
                    sampling=sampling, rng=jax.random.key(args.seed),
                    mesh=partitioning.make_mesh(cfg.mesh))
  except (ConfigError, FileNotFoundError, ValueError) as e:  # Prompts, sampling settings.
    cli.print_error(e, getattr(args, "debug", False) or cli.debugging([]))
    return cli.EXIT_USER_ERROR
  print(f"{cfg.model.family} checkpoint {step_dir}")
  for i, (p, o) in enumerate(zip(prompts, outs)):
    print(f"--- [{i}] prompt: {p}\n{vocab.decode(o)}")
  return 0
