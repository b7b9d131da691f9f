"""The one settings object of the service, read from SEMJOBS_* environment variables.

Every part of the service (CLI, worker, database, migrations) imports `settings` from here,
so a deployment is configured in one place. The engine (`semspec`) never reads it: the
service passes plain values into the engine.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


# A file of SEMJOBS_* lines is read only when named: a `.env` that happens to sit in the
# working directory (a shared folder, a cloned repository) must not point the service at
# another database or make it import code (engine_factory).
ENV_FILE = os.environ.get("SEMJOBS_ENV_FILE") or None


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SEMJOBS_", env_file=ENV_FILE, extra="ignore")

    # Storage: Postgres in production; the embedded mode (`semjobs run`) uses SQLite.
    database_url: str = "postgresql+psycopg://postgres@127.0.0.1:5432/semjobs"
    # Broker and result backend.
    redis_url: str = "redis://127.0.0.1:6379/0"
    # Where converted models and other caches live.
    cache_dir: Path = Path.home() / ".cache" / "semjobs"

    # Models: None means the embedded defaults shipped in wheels / in the repo.
    target_model: str | None = None
    # Another name a Batch line's body.model may call the target by, as vLLM's
    # --served-model-name: a file written for a server that serves it so runs unchanged.
    # Otherwise a body.model must name the target as target_model does (or its hub name).
    served_model_name: str | None = None
    draft_model: str | None = None
    probes_dir: str | None = None
    device: str = "auto"  # "auto" picks CUDA when present, else the CPU
    # Number type of the models: "auto" is bfloat16 on CUDA and on a CPU with bfloat16
    # instructions (AMX, AVX512-BF16), float32 otherwise (semspec.engine.token_engine.vllm_dtype).
    # "float32" / "bfloat16" force one.
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    # Items one engine process decodes at once (continuous batching, shared by every chunk
    # the process holds). 32 measured best on a 2-core CPU (docs/batching.md).
    batch_size: int = Field(default=32, ge=1)
    # Engine processes of `semjobs run` and `semjobs worker`, and torch CPU threads in each
    # (torch.set_num_threads before the engine loads). None: on a CPU one process per core
    # (per `threads` cores) with one thread, `run` keeping 8 items a process; on an
    # accelerator one process, torch's threads (semjobs.worker.engine_processes.plan). On a 2-core
    # CPU one thread decoded 3 items 3.7x faster than two; workers x threads <= free cores.
    processes: int | None = Field(default=None, ge=1)
    threads: int | None = Field(default=None, ge=1)

    # vLLM decodes (semjobs.worker.engine.factory_for: semspec.engine.token_engine for ar and token_sd,
    # semspec.engine.step_engine, a target and a draft engine, for semspec and step_judge): the KV
    # cache's whole budget per engine process, in GiB (a sequence that does not fit waits for
    # room rather than failing; None: 2 GiB on a CPU, on a GPU what vLLM's gpu_memory_utilization
    # leaves), and vLLM's compiled graphs (torch.compile; CUDA graphs on a GPU) instead of eager
    # mode. None: compiled in `semjobs worker`, a process that decodes for hours (start-up about
    # a minute longer here, less once vLLM's cache under VLLM_CACHE_ROOT holds the graphs), eager
    # where start-up dominates (`run`, `bench`, `probe`).
    kv_cache_gb: float | None = Field(default=None, gt=0)
    vllm_compile: bool | None = None
    # vLLM's own engine arguments (EngineArgs names) as JSON objects, per role: target (ar's and
    # token_sd's engine, the step engines' target and writer) and draft (the step engines' draft),
    # e.g. SEMJOBS_TARGET_ENGINE_ARGS='{"tensor_parallel_size": 2, "max_model_len": 32768}'. They
    # win over semjobs' defaults; `run`, `worker`, `bench` and `probe collect` add --engine-arg /
    # --draft-engine-arg and check them against vLLM before anything is stored or loaded
    # (semspec.engine.engine_args).
    target_engine_args: Annotated[dict[str, Any], NoDecode] = Field(default_factory=dict)
    draft_engine_args: Annotated[dict[str, Any], NoDecode] = Field(default_factory=dict)
    # Overrides vLLM: an engine as "module:attribute[.attribute]", called once per process
    # as factory(target=, draft=, probes=, device=, cache_dir=, dtype=, batch_size=), and
    # engine_args= / draft_engine_args= when the settings give any; it must
    # return an object with .identities and .generate_many(requests, batch_size=)
    # (semspec.engine.token_engine.VLLMEngine's). Tests and the overhead benchmark point it at an instant fake.
    engine_factory: str | None = None

    # Job defaults (each can be overridden per job on the command line, per item in the input).
    method: str = "ar"  # becomes "semspec" once the embedded draft and probes ship
    max_new_tokens: int = Field(default=512, gt=0)
    temperature: float = Field(default=0.0, ge=0, le=2)
    # semspec, step_judge and token_sd draft only while at most this many sequences are in flight
    # (GenerationConfig.draft_max_batch); None: the engine's choice (1 on a CPU), 0: always.
    draft_max_batch: int | None = Field(default=None, ge=0)
    seed: int = Field(default=0, ge=0, le=2**63 - 1)  # a line's seed takes the same (jobs.schema.MAX_SEED)
    # A sample that starts repeating itself ends there (finish reason "repetition", its text cut
    # at the loop's onset; GenerationConfig.stop_loops): a looping tail is thrown away anyway.
    stop_loops: bool = True
    # A sampled sample the doom rule says will not end right ends there (finish reason "doomed";
    # GenerationConfig.stop_doomed): on wherever a rule is given, as doom_rule, a JSON file
    # `semjobs doom calibrate` wrote for the worker's target (semspec.doom). None: no rule, no
    # sample is stopped so. The step methods apply a rule of the length kind only.
    stop_doomed: bool = True
    doom_rule: Path | None = None

    # Embedded mode (`semjobs run`): no servers, one SQLite file.
    embedded_database_url: str = "sqlite:///semjobs.sqlite"
    # Where `run` and `submit` record the job they stored and its database, so the other
    # commands find it without flags (semjobs.jobs.locate); None: cache_dir / "last_run.json".
    last_run_file: Path | None = None

    # Worker behaviour (README "Workers that die" says why each exists).
    # One queue for every job and calibration of this deployment; None: a queue per model pair
    # and method, "semjobs.<target>+<draft>.<method>" (semjobs.worker.queues).
    queue: str | None = None
    # The methods this deployment's workers decode, e.g. SEMJOBS_METHODS=semspec: a worker
    # consumes only their queues and plans its GPU's memory for their engines only
    # (semjobs.worker.gpu_memory); None: every method. Not with `queue`, which carries them all.
    methods: Annotated[list[str] | None, NoDecode] = None
    chunk_size: int = 4  # items per Celery task; keeps a task well inside the visibility timeout
    visibility_timeout_s: int = 3 * 3600
    max_attempts: int = 3  # deliveries of one item (worker lost) before it is marked failed
    # An engine that cannot load (a model file missing, a broken install) is tried this many
    # times per chunk, engine_retry_s apart and doubling, before the chunk's items fail with
    # the load error as their reason: a job never waits silently on workers that cannot serve it.
    engine_load_attempts: int = Field(default=3, ge=1)
    engine_retry_s: float = Field(default=10.0, ge=0)
    # Fast recovery of a whole worker lost (SIGKILL, preempted node), whose chunk the broker
    # would only hand out again after visibility_timeout_s: every process that runs tasks
    # beats every heartbeat_interval_s; one silent for worker_dead_after_s is dead, and the
    # next live worker (or `semjobs recover`) re-enqueues the items it held. Generous against
    # stalls (a stalled worker taken for dead costs repeated work, never a second output).
    heartbeat_interval_s: float = Field(default=5.0, gt=0)
    worker_dead_after_s: float = Field(default=45.0, gt=0)
    # `semjobs status` calls an active job stalled, and says why, when no item has finished
    # for this long (or for five times its mean time between finishes, if longer).
    stall_after_s: float = Field(default=120.0, gt=0)
    # What a worker acts on (stall_after_s only reports): an engine that holds items but has
    # not turned (asked for work, handed back a result) for progress_timeout_s is hung; the
    # item it hung on fails with that reason, the worker hands back the rest and stops
    # (semjobs.worker.batching). A job left pending (stored, never enqueued: its submit died
    # or met a broker that was down) is enqueued by a worker's orphan scan once seen so for
    # pending_grace_s, so a submit that is still enqueueing is not raced (semjobs.worker.orphans).
    progress_timeout_s: float = Field(default=600.0, gt=0)
    pending_grace_s: float = Field(default=60.0, ge=0)
    # A running chunk retries its commits through a database outage this long (semjobs.db.retry),
    # holding finished results in memory; past it the chunk ends and its task retries.
    database_retry_s: float = Field(default=300.0, ge=0)

    # Input limits and bulk-insert batch size for `submit`. check_prompt_lengths: refuse at
    # submit a prompt longer than the target's context (its tokenizer tells; semjobs.jobs.context).
    # The limits keep one job from filling the database and the broker that every job shares
    # (each sample stores its input's request: a 1 MB line with n 64 stores 64 MB); a job over
    # one is refused whole at validation, naming the limit. Raise them per deployment.
    max_line_bytes: int = Field(default=1_000_000, ge=1)  # one input line
    max_job_items: int = Field(default=1_000_000, ge=1)  # items of a job: inputs x samples
    max_job_bytes: int = Field(default=1 << 30, ge=1)  # what a job stores: its lines' bytes x samples
    check_prompt_lengths: bool = True
    insert_batch_size: int = 2000

    @field_validator("target_engine_args", "draft_engine_args", mode="before")
    @classmethod
    def _json_object(cls, value: Any) -> Any:
        # parsed here, not by pydantic-settings, so that bad JSON is a ValidationError naming the setting
        return json.loads(value) if isinstance(value, str) else value

    @field_validator("methods", mode="before")
    @classmethod
    def _method_list(cls, value: Any) -> Any:
        from semspec.types import METHODS

        if value is None:
            return None
        if isinstance(value, str):  # the environment's "semspec,step_judge"
            value = [m.strip() for m in value.split(",") if m.strip()]
        unknown = [m for m in value if m not in METHODS]
        if unknown:
            raise ValueError(f"unknown method(s) {', '.join(map(repr, unknown))}; choose from {', '.join(METHODS)}")
        return list(dict.fromkeys(value)) or None

    @model_validator(mode="after")
    def _methods_have_queues(self) -> Settings:
        if self.methods and self.queue:
            raise ValueError("methods and queue cannot go together: the one queue carries every method's jobs")
        return self

    @model_validator(mode="after")
    def _env_file_exists(self) -> Settings:
        if ENV_FILE is not None and not Path(ENV_FILE).is_file():  # pydantic skips a missing one silently
            raise ValueError(f"SEMJOBS_ENV_FILE names {ENV_FILE}, which is not a file")
        return self

    @model_validator(mode="after")
    def _dead_after_spans_beats(self) -> Settings:
        # A worker must be able to miss a beat (a slow database round trip) and stay alive.
        if self.worker_dead_after_s < 2 * self.heartbeat_interval_s:
            raise ValueError("worker_dead_after_s must be at least 2 x heartbeat_interval_s")
        return self


settings = Settings()
