"""Sharding is checked, not guessed (8 fake CPU devices in a subprocess):

- a parameter dimension the mesh does not divide is a ConfigError before anything compiles,
  naming the parameter, its logical axes, the mesh and the fix;
- ``mesh.allow_replication=true`` replicates it instead, with a warning;
- the per-device bytes of parameters + optimizer state and the replicated arrays are logged and
  equal an independent count from the logical axes.
"""
from __future__ import annotations

import json

from train_helpers import run_script

SCRIPT = r"""
import json, logging, math
import jax, numpy as np
from t5like import partitioning
from t5like.config import ConfigError
from t5like.training import state as state_lib
from train_helpers import tiny_config

records = []
class Keep(logging.Handler):
  def emit(self, r):
    records.append(r.getMessage())
logging.getLogger("t5like").addHandler(Keep())
logging.getLogger("t5like").setLevel(logging.INFO)
out = {}

cfg = tiny_config("decllm")
cfg.model.d_model = 36  # Not divisible by fsdp=8.
cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor = 1, 8, 1
try:
  state_lib.build_setup(cfg, partitioning.make_mesh(cfg.mesh))
  out["error"] = None
except ConfigError as e:
  out["error"] = str(e)

cfg.mesh.allow_replication = True
setup = state_lib.build_setup(cfg, partitioning.make_mesh(cfg.mesh))
wq = setup.state_shardings.params["decoder"]["layers"]["attention"]["wq"]
out["wq_spec"] = [str(s) for s in wq.spec]
out["warned"] = [m for m in records if "replicated instead" in m]

cfg.model.d_model = 32
cfg.mesh.allow_replication = False
setup = state_lib.build_setup(cfg, partitioning.make_mesh(cfg.mesh))
records.clear()
out["layout"] = state_lib.log_memory_layout(setup)
out["logged"] = [m for m in records if "per device" in m or "replicated on every" in m]
# Independent count: arrays with an 'embed' axis are split 8 ways, the others are whole.
expect, replicated = 0, 0
flat_axes = jax.tree.leaves(setup.param_axes, is_leaf=lambda x: isinstance(x, tuple))
for x, axes in zip(jax.tree.leaves(setup.abstract_state.params), flat_axes):
  n = math.prod(x.shape) * np.dtype(x.dtype).itemsize
  expect += n // 8 if "embed" in axes else n
  replicated += 0 if "embed" in axes else n
out["expect_params"], out["expect_replicated"] = expect, replicated
print("RESULT" + json.dumps(out))
"""


def test_undivided_dimensions_fail_early_or_replicate_by_choice():
  proc = run_script(SCRIPT, devices=8)
  out = json.loads(proc.stdout.split("RESULT", 1)[1])
  err = out["error"]
  assert err is not None, "d_model=36 on fsdp=8 must not be silently replicated"
  assert "['decoder']['layers']['attention']['wq']" in err and "embed=36" in err
  assert "fsdp=8" in err and "mesh.allow_replication=true" in err
  assert "sizes dividing 36: 2, 3, 4, 6, 9, 12, 18" in err
  assert out["wq_spec"][1] == "None" and out["warned"]
  layout = out["layout"]
  assert layout["params"] == out["expect_params"]
  assert layout["replicated_params"] == out["expect_replicated"] > 0
  assert layout["opt_state"] > 0
  assert any("per device: parameters" in m for m in out["logged"])
  assert any("replicated on every device" in m for m in out["logged"])
