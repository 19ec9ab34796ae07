"""Registers a text corpus under a denoising objective (``data.objective`` span_corruption / ul2).

``span_corruption``: ``<name>:span``, the corpus (or part) with T5 span corruption.
``ul2``: one registration per denoiser, ``<name>:ul2_<denoiser>`` (each a seqio task per subset
and a mixture by token count, like every objective variant of the corpus), and the seqio mixture
``<name>:ul2`` over them with the denoisers' rates (``data.ul2_denoisers``): seqio's mixing of
sub-mixtures draws denoiser ``d`` with probability ``rate_d / sum(rates)``, then a subset by its
share. Settings travel in the registration spec, so changing them re-registers.
"""
from __future__ import annotations

import dataclasses

from t5like.data import tasks


def variant_of(objective: str, denoiser: str) -> str:
  return "span" if objective == "span_corruption" else f"ul2_{denoiser}"


def register(cfg, name: str) -> str:
  """Registers ``name`` (a corpus or part) under ``cfg.data.objective``; returns its seqio name."""
  import seqio  # pylint: disable=g-import-not-at-top

  data = cfg.data
  corpus = name.split(".", 1)[0]
  entries = []
  for key, d in data.denoisers().items():
    variant = variant_of(data.objective, key)
    spec = dataclasses.replace(
        tasks.spec_from_config(cfg, corpus, variant),
        denoiser=(d["mode"], float(d.get("noise_density", 0.15)),
                  float(d.get("mean_noise_span_length", 3.0))))
    tasks.register(spec)
    full = tasks.seqio_name(name, variant)
    if full not in seqio.TaskRegistry.names() and full not in seqio.MixtureRegistry.names():
      raise ValueError(f"{name!r} is not a part of {corpus}; available: "
                       f"{', '.join(n for n in tasks.registered_names() if n.startswith(corpus))}")
    if data.objective == "span_corruption":
      return full
    if d["rate"] > 0:
      entries.append((full, float(d["rate"])))
  if not entries:
    raise ValueError("every denoiser of data.ul2_denoisers has rate 0")
  mixture = tasks.seqio_name(name, "ul2")
  if mixture in seqio.MixtureRegistry.names():
    seqio.MixtureRegistry.remove(mixture)  # Cheap to rebuild; its parts may have been replaced.
  seqio.MixtureRegistry.add_provider(mixture, seqio.Mixture(mixture, entries))
  return mixture
