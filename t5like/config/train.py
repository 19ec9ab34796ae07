"""Training, mesh, checkpoint and multi-process config (docs/paper.md §1 "Training").

Defaults are the paper's pretraining hyper-parameters; ``configs/*.py`` change what differs
(instruction tuning: constant 1e-3, no z-loss; tiny CPU configs: few steps, small batches).
"""
from __future__ import annotations

import dataclasses

from t5like.config.schema import ConfigError, check_choice, check_positive

SCHEDULES = ("warmup_cosine", "constant")
FIT_MODES = ("", "auto", "check", "off")
DISTRIBUTED_MODES = ("auto", "on", "off")
DCN_AXES = ("data", "fsdp")


@dataclasses.dataclass
class MeshConfig:
  """Device mesh; one size may be -1 to take the remaining devices (of one slice)."""

  slices: int = 0  # Slices joined over the data-center network (DCN): 0 = as many as the devices
  #   span (their slice_index: multi-slice TPUs, or --num_slices AOT topologies; else 1). On
  #   GPUs / CPU processes, which carry no slice_index, N > 1 makes each process one slice.
  #   data/fsdp/tensor/expert below are the sizes inside one slice.
  dcn_axis: str = "data"  # What crosses DCN: "data" (data parallelism over the slices: one
  #   gradient all-reduce per step over DCN, the mesh's `dcn` axis) or "fsdp" (parameters sharded
  #   across slices too: every layer's all-gather crosses DCN; only to fit a model that one slice's
  #   HBM cannot hold).
  data: int = 1  # Pure data-parallel replicas.
  fsdp: int = -1  # Fully-sharded data parallel (parameters sharded over 'embed').
  tensor: int = 1  # Tensor parallel (heads / mlp / vocab).
  expert: int = 1  # Expert parallel: MoE experts split over this axis (model.moe.capacity_factor
  #   > 0), which also splits the batch like data.
  allow_replication: bool = False  # A parameter dimension the mesh does not divide is an error
  #   before compile; true replicates it instead (logged with its bytes per device).
  sparsecore_collectives: bool = True  # TPU chips with SparseCores (v4, v5p, v6e, TPU7x): the
  #   steps' all-gathers, reduce-scatters, all-reduces and large sorts run on the SparseCores
  #   (partitioning.compiler_options); false leaves them to libtpu's defaults. No effect on v5e.

  def validate(self) -> "MeshConfig":
    check_choice("mesh.dcn_axis", self.dcn_axis, DCN_AXES)
    check_positive("mesh.slices", self.slices, allow_zero=True)
    sizes = (self.data, self.fsdp, self.tensor, self.expert)
    if sum(s == -1 for s in sizes) > 1:
      raise ConfigError(f"at most one mesh axis may be -1, got data/fsdp/tensor/expert={sizes}")
    if any(s == 0 or s < -1 for s in sizes):
      raise ConfigError(f"mesh sizes must be positive or -1, got data/fsdp/tensor/expert={sizes}")
    return self


@dataclasses.dataclass
class TrainConfig:
  """Optimisation hyper-parameters and loop settings."""

  steps: int = 400_000  # Total optimizer steps (one step = one global batch).
  batch_size: int = 2048  # Global batch in sequences (rows), summed over all hosts.
  microbatches: int = 1  # Gradient accumulation: the batch is split into this many microbatches
  #   run one after the other (same update as the full batch; less activation memory).
  learning_rate: float = 0.01  # Peak learning rate (constant value for schedule="constant").
  schedule: str = "warmup_cosine"  # "warmup_cosine" (pretraining) or "constant" (instruction tuning).
  warmup_steps: int = 2000  # Linear warmup from 0 to the peak (warmup_cosine only).
  decay_steps: int = 0  # Step where the cosine reaches its floor; 0 means train.steps. A warmup
  #   longer than this horizon is allowed (short test runs): the cosine then starts after it.
  final_lr_fraction: float = 0.1  # Cosine decays to this fraction of the peak.
  adafactor_decay_rate: float = 0.8  # Adafactor second-moment decay exponent (t^-0.8).
  adafactor_min_dim_to_factor: int = 128  # Factor the second moment of arrays whose two largest
  #   dimensions are both at least this big; smaller arrays keep a full second moment.
  adafactor_clipping_threshold: float = 1.0  # Adafactor's per-array update RMS clipping (0 = off).
  adafactor_scale_by_param_rms: bool = True  # Scale updates by the parameter RMS (relative steps).
  adafactor_per_layer: bool = True  # Update clipping and parameter RMS per layer of a stacked
  #   [layers, ...] array (as T5X with scanned layers); False = over the whole stack at once.
  clip_grad_norm: float = 1.0  # Global-norm gradient clipping before Adafactor (0 disables).
  z_loss: float = 1e-4  # Coefficient of the z-loss (log Z)^2 term (0 = none).
  seed: int = 0  # Parameter init and dropout seed.
  init_from: str = ""  # Instruction tuning: a checkpoint to take the parameters from (a workdir,
  #   its checkpoints/ directory, or one step directory); the optimizer and step start fresh.
  #   "" = random initialisation. Ignored when the workdir already holds a checkpoint (resume).
  log_every: int = 100  # Write metrics (TensorBoard, metrics.jsonl) every N steps.
  eval_every: int = 1000  # Held-out eval loss every N steps (0 = only at the end).
  eval_steps: int = 20  # Batches per held-out evaluation (fewer if the split runs out).
  eval_batch_size: int = 0  # Global eval batch in rows; 0 means train.batch_size.
  max_nonfinite_steps: int = 10  # Stop with an error after this many consecutive steps whose loss
  #   or gradient was NaN/Inf (each such step is skipped: no update is applied).
  peak_flops_per_device: float = 0.0  # Peak FLOP/s of one device for MFU; 0 = look it up from the
  #   device kind (TPU/GPU tables; CPU: a matmul probe once per process, shared by its devices).
  progress_bar: bool = True  # Console progress bar with ETA (process 0 only).
  profile_steps: str = ""  # "START:STOP": a jax.profiler trace of the steps that take the state
  #   from step START to step STOP, written under <workdir>/profile (TensorBoard's profile tab;
  #   Perfetto). "" = off. E.g. "10:13" traces three steps after compilation and warm-up.
  fit: str = ""  # Before the first step: "auto" takes the first candidate remat/microbatch
  #   setting that leaves 20 % of the memory free when the configured one does not, or on a TPU
  #   one predicted faster that does (logged);
  #   "check" fails naming that setting; "off" trusts the config; "" = auto on TPU/GPU, off on
  #   CPU (t5like/training/fit.py, docs/pods.md).
  fit_budget_gib: float = 0.0  # Memory per device train.fit must fit in; 0 = the device's own.
  compile_cache: bool = True  # Persistent compilation cache (docs/compile.md): a restart of the same
  #   config on the same devices and JAX version loads its compiled steps instead of compiling.
  compile_cache_dir: str = ""  # Where (any URI, gs:// included; shared by all hosts). "" =
  #   $JAX_COMPILATION_CACHE_DIR if set, else <workdir>/compile_cache.
  compile_cache_min_compile_s: float = 1.0  # Cache only programs that took at least this long to
  #   compile (each entry costs a file write/read, a round trip on gs://); 0 = every program.

  def validate(self) -> "TrainConfig":
    check_choice("train.schedule", self.schedule, SCHEDULES)
    check_choice("train.fit", self.fit, FIT_MODES)
    check_positive("train.fit_budget_gib", self.fit_budget_gib, allow_zero=True)
    check_positive("train.steps", self.steps)
    check_positive("train.batch_size", self.batch_size)
    check_positive("train.microbatches", self.microbatches)
    check_positive("train.learning_rate", self.learning_rate)
    check_positive("train.warmup_steps", self.warmup_steps, allow_zero=True)
    check_positive("train.decay_steps", self.decay_steps, allow_zero=True)
    check_positive("train.z_loss", self.z_loss, allow_zero=True)
    check_positive("train.clip_grad_norm", self.clip_grad_norm, allow_zero=True)
    check_positive("train.adafactor_min_dim_to_factor", self.adafactor_min_dim_to_factor)
    check_positive("train.adafactor_clipping_threshold", self.adafactor_clipping_threshold,
                   allow_zero=True)
    check_positive("train.log_every", self.log_every)
    check_positive("train.eval_every", self.eval_every, allow_zero=True)
    check_positive("train.eval_steps", self.eval_steps, allow_zero=True)
    check_positive("train.eval_batch_size", self.eval_batch_size, allow_zero=True)
    check_positive("train.max_nonfinite_steps", self.max_nonfinite_steps)
    check_positive("train.peak_flops_per_device", self.peak_flops_per_device, allow_zero=True)
    self.profile_window()
    check_positive("train.compile_cache_min_compile_s", self.compile_cache_min_compile_s,
                   allow_zero=True)
    if not 0.0 < self.adafactor_decay_rate <= 1.0:
      raise ConfigError(
          f"train.adafactor_decay_rate must be in (0, 1], got {self.adafactor_decay_rate}")
    if not 0.0 <= self.final_lr_fraction <= 1.0:
      raise ConfigError(
          f"train.final_lr_fraction must be in [0, 1], got {self.final_lr_fraction}")
    if self.batch_size % self.microbatches:
      raise ConfigError(
          f"train.batch_size={self.batch_size} is not divisible by train.microbatches="
          f"{self.microbatches}; pick a number of microbatches that divides the batch")
    return self

  def profile_window(self) -> tuple[int, int] | None:
    """``profile_steps`` as (START, STOP), None when off; a malformed window is a ConfigError."""
    if not self.profile_steps:
      return None
    try:
      start_s, stop_s = self.profile_steps.split(":")
      start, stop = int(start_s), int(stop_s)
    except ValueError:
      raise ConfigError(f"train.profile_steps={self.profile_steps!r} is not START:STOP (e.g. "
                        "'10:13' traces the steps from step 10 to step 13); '' is off") from None
    if not 0 <= start < stop:
      raise ConfigError(f"train.profile_steps={self.profile_steps!r}: need 0 <= START < STOP")
    return start, stop


@dataclasses.dataclass
class CheckpointConfig:
  """Orbax checkpoints: when to save, how many to keep, where."""

  every: int = 1000  # Save every N steps (0 = only at the end and on preemption/SIGTERM).
  keep: int = 3  # Keep the newest K checkpoints (0 = keep all).
  async_save: bool = True  # Write in the background while training continues.
  save_at_end: bool = True  # Save after the last step.
  dir: str = ""  # Checkpoint directory; "" means <workdir>/checkpoints.
  resume: bool = True  # Resume from the newest restorable checkpoint in the directory.
  restore_data: bool = True  # Also restore the data-iterator position (exact resume). False:
  #   restore the train state only and restart the data stream, e.g. after changing the number
  #   of hosts or the data settings (the batches then differ from an uninterrupted run).

  def validate(self) -> "CheckpointConfig":
    check_positive("checkpoint.every", self.every, allow_zero=True)
    check_positive("checkpoint.keep", self.keep, allow_zero=True)
    if self.keep == 1:
      raise ConfigError(
          "checkpoint.keep=1 leaves nothing to fall back to if the newest checkpoint is "
          "corrupt; keep at least 2 (or 0 = all)")
    return self


@dataclasses.dataclass
class DistributedConfig:
  """Multi-process (multi-host) start-up; flags win over the JAX_* environment variables."""

  mode: str = "auto"  # "auto": jax.distributed.initialize() when flags/environment describe
  #   several processes, or on a multi-host TPU slice; "on": always; "off": never (one process).
  coordinator_address: str = ""  # host:port of process 0 (GPU/CPU clusters);
  #   env JAX_COORDINATOR_ADDRESS. TPU pods detect it themselves.
  num_processes: int = 0  # Total processes; 0 = env JAX_NUM_PROCESSES or auto-detect.
  process_id: int = -1  # This process's id; -1 = env JAX_PROCESS_ID or auto-detect.
  local_device_ids: str = ""  # Comma-separated local device ids this process uses ("" = all).
  initialization_timeout_s: int = 300  # How long to wait for all processes to join.
  heartbeat_timeout_s: int = 900  # A process silent this long is declared dead and the job
  #   stops (JAX's default, 100 s, kills multi-slice jobs whose hosts are busy compiling: keep it
  #   above the longest compile, docs/pods.md); lower it to notice a lost host sooner.
  shutdown_timeout_s: int = 900  # How long a finishing process waits for the others at exit
  #   (one may still be writing its last checkpoint or compiling its final eval step).

  def validate(self) -> "DistributedConfig":
    check_choice("distributed.mode", self.mode, DISTRIBUTED_MODES)
    check_positive("distributed.num_processes", self.num_processes, allow_zero=True)
    check_positive("distributed.initialization_timeout_s", self.initialization_timeout_s)
    check_positive("distributed.heartbeat_timeout_s", self.heartbeat_timeout_s)
    check_positive("distributed.shutdown_timeout_s", self.shutdown_timeout_s)
    if self.process_id < -1:
      raise ConfigError(f"distributed.process_id must be >= 0 or -1, got {self.process_id}")
    if self.num_processes and self.process_id >= self.num_processes:
      raise ConfigError(
          f"distributed.process_id={self.process_id} must be < distributed.num_processes="
          f"{self.num_processes}")
    if self.local_device_ids:
      try:
        [int(x) for x in self.local_device_ids.split(",")]
      except ValueError:
        raise ConfigError(
            "distributed.local_device_ids must be comma-separated integers, got "
            f"{self.local_device_ids!r}") from None
    return self
