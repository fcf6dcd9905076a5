"""The run configuration: one pydantic model per concern, composed into `RunConfig`.

Every default lives in this package (the methods' in `methods.py`; a domain's own fields in
`distill/domains/<name>/config.py`, found through the registry). Nothing heavy is imported here: `distill --help` and config errors must
stay instant.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, ClassVar, Literal

from pydantic import (
    Field,
    SerializeAsAny,
    ValidationError,
    field_validator,
    model_validator,
)

from distill import registry
from distill.config.base import ConfigError, Precision, Sampling, Strict
from distill.config.methods import MethodConfig, OPDMethod, ROSEMethod, SFTMethod


class ServerClientConfig(Strict):
    """How the `server` engine talks to an OpenAI-compatible vLLM server (`distill serve teacher`)."""

    # Seconds one HTTP request may take before it is retried (a long continuation batch needs more).
    timeout_s: float = Field(120.0, gt=0)
    # Extra attempts per request after a connection error, timeout or 5xx; then the step fails.
    retries: int = Field(2, ge=0)
    # Seconds between attempts (doubled each time).
    backoff_s: float = Field(1.0, ge=0)
    # Requests in flight at once; each carries `batch_size` rows.
    concurrency: int = Field(4, ge=1)
    batch_size: int = Field(8, ge=1)


class ModelConfig(Strict):
    """A student or teacher: `zoo:<name>`, a local path, or a Hugging Face id."""

    name: str
    # hf: transformers in this process. server: a vLLM server at `url` serving the same model
    # (teacher only; the tokenizer is still loaded locally from `name`).
    engine: Literal["hf", "server"] = "hf"
    url: str | None = None
    server: ServerClientConfig = Field(default_factory=ServerClientConfig)
    precision: Precision = "fp32"
    # None: the model family's own default; passed to chat templates as `enable_thinking`.
    enable_thinking: bool | None = None
    # Where the model runs (engine=hf): auto is the GPU the trainer uses when there is one, else
    # the CPU; cpu, cuda or cuda:N pin it. A model left on the CPU beside a GPU is said at start.
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$")
    # A Jinja chat-template file for a tokenizer that has none (or whose own should not be used):
    # a tokenizer without a template is refused rather than given a silent default.
    chat_template: str | None = None
    # teacher.shard=true: an hf teacher split over the ranks of an FSDP2 or ZeRO-3 launch for
    # inference (1/N of its weights on each, gathered a layer at a time), for OPD's scoring; where
    # it cannot run it is refused in one line (teacher_shard.py). False: whole on every rank.
    # `student.shard` is refused (the launcher shards the student).
    shard: bool = False

    @model_validator(mode="after")
    def _server_needs_url(self) -> ModelConfig:
        if self.engine == "server" and not self.url:
            raise ValueError("engine=server needs url (e.g. teacher.url=http://127.0.0.1:8000)")
        return self


class DomainBase(Strict):
    """What every domain config has; each domain's own model (`distill/domains/<name>/config.py`,
    named in `distill/registry.py`) adds its fields."""

    # Bumped by a domain when the same config starts to materialise different items (a fix in how
    # they are made): it re-keys its cached items and the zoo models trained on them, so an old
    # workspace does not go on with data the fixed code would not make. 0 leaves keys as they were.
    data_version: ClassVar[int] = 0
    # Fields of how items are used (an episode's turn limit, the simulator pool), not of which items
    # there are: the items' key leaves them out.
    runtime_fields: ClassVar[tuple[str, ...]] = ()

    name: str
    train_size: int = Field(4096, ge=1)
    eval_size: int = Field(200, ge=1)
    # Eval items are drawn from a seed stream disjoint from training items.
    eval_seed: int = 1_000_003

    def data_key(self, include: set[str] | None = None) -> dict[str, Any]:
        """What the materialised data is keyed by: this config (or its `include`d fields) less its
        runtime fields, and the domain's `data_version` once it has bumped it."""
        key: dict[str, Any] = self.model_dump(mode="json", include=include, exclude=set(self.runtime_fields))
        if self.data_version:
            key["data_version"] = self.data_version
        return key

    def items_key(self) -> str:
        """The key of `<workspace>/data/<name>-<split>-<key>.jsonl`, this config's items."""
        blob = json.dumps(self.data_key(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]


def domain_model(name: str) -> type[DomainBase]:
    """The config model of domain `name`, through the registry (a light pydantic module)."""
    try:
        entry = registry.domain_entry(name)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    model = registry.resolve(entry.config)
    if not (isinstance(model, type) and issubclass(model, DomainBase)):
        raise TypeError(f"registry: {entry.config} is not a DomainBase model")
    return model


def domain_config(name: str, **fields: Any) -> DomainBase:
    """A domain's config from its name and fields (validated like the `domain:` section)."""
    model = domain_model(name)
    try:
        return model.model_validate({"name": name, **fields})
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, prefix="domain")) from None


class LoRAConfig(Strict):
    """Train the student through LoRA adapters (peft) instead of all weights."""

    enabled: bool = False
    rank: int = Field(16, ge=1)
    alpha: int = Field(32, ge=1)
    dropout: float = Field(0.0, ge=0, lt=1)
    targets: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )


class RolloutConfig(Strict):
    """Student sampling during training (and teacher sampling for teacher-SFT)."""

    prompts_per_step: int = Field(16, ge=1)
    num_generations: int = Field(2, ge=1)
    max_new_tokens: int = Field(64, ge=1)
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    # Who generates the student's rollouts in the TRL-trainer methods (opd, opsd): hf is
    # transformers' generate in the training process (the CPU default); vllm is TRL's vLLM
    # integration (GPU, `pip install vllm` in distill's own environment).
    engine: Literal["hf", "vllm"] = "hf"
    # vllm only. colocate: vLLM inside each training process, sharing its GPU; server: a
    # `trl vllm-serve` process at `vllm_server_url`, weights synced to it every step.
    vllm_mode: Literal["colocate", "server"] = "colocate"
    vllm_server_url: str | None = None
    vllm_gpu_memory_utilization: float = Field(0.3, gt=0, le=1)
    vllm_tensor_parallel_size: int = Field(1, ge=1)
    # opd: the teacher scores step i's rollouts while the student generates step i+1's and trains
    # on step i's (one step stale; the teacher behind a server, or in a worker process for hf).
    async_teacher: bool = False

    def sampling(self) -> Sampling:
        """How the student samples its training rollouts."""
        return Sampling(self.max_new_tokens, self.temperature, self.top_p)

    @model_validator(mode="after")
    def _vllm_server_needs_url(self) -> RolloutConfig:
        if self.engine == "vllm" and self.vllm_mode == "server" and not self.vllm_server_url:
            raise ValueError(
                "rollout.vllm_mode=server needs rollout.vllm_server_url (the `trl vllm-serve` address)"
            )
        return self


class OptimConfig(Strict):
    lr: float = Field(1e-4, gt=0)
    max_steps: int = Field(100, ge=1)
    warmup_ratio: float = Field(0.0, ge=0, lt=1)
    scheduler: Literal["constant", "linear", "cosine"] = "constant"
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)
    grad_accum: int = Field(1, ge=1)
    # Batch size (sequences) for supervised methods.
    batch_size: int = Field(32, ge=1)
    # Recompute activations in backward (TRL's default): saves GPU memory, costs time on tiny models.
    gradient_checkpointing: bool = False


class EvalConfig(Strict):
    # 0: evaluate only before and after training.
    every_steps: int = Field(0, ge=0)
    items: int = Field(200, ge=1)
    # Samples per item; k=1 with temperature 0 is greedy accuracy.
    k: int = Field(1, ge=1)
    temperature: float = Field(0.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_new_tokens: int = Field(64, ge=1)
    batch_size: int = Field(64, ge=1)
    eval_teacher: bool = True
    # A benchmark item whose prompt leaves the model no room to answer: fail names the items and
    # stops; skip leaves them out and reports how many (verl's filter_overlong_prompts).
    overlong: Literal["fail", "skip"] = "fail"

    def sampling(self) -> Sampling:
        """How a model answers an eval item."""
        return Sampling(self.max_new_tokens, self.temperature, self.top_p)


class CheckpointConfig(Strict):
    # 0: only the final checkpoint.
    every_steps: int = Field(25, ge=0)


MAX_RUN_NAME = 200


def run_name_problem(name: str) -> str | None:
    """Why `name` cannot be a run id, or None. A run id is one folder under `<workspace>/runs/`
    (and the MLflow run name): a separator, `..` or a leading dot would put it somewhere else."""
    if not name or not name.strip():
        return "must not be empty"
    if "/" in name or "\\" in name or "\x00" in name:
        return f"{name!r} must be one path component (no '/' or '\\')"
    if name.startswith("."):
        return f"{name!r} must not start with a dot"
    if len(name) > MAX_RUN_NAME:
        return f"must be at most {MAX_RUN_NAME} characters"
    return None


class TrackingConfig(Strict):
    experiment: str = "distill"
    # The run id: the run's folder name under `<workspace>/runs/` and the MLflow run name.
    run_name: str | None = None
    # The MLflow run this one is a child of (`distill grid` sets its parent run); None: top level.
    parent_run_id: str | None = None
    # None: DISTILL_TRACKING_URI, else the embedded sqlite store in the workspace.
    uri: str | None = None
    # Rollouts written to samples/step-N.jsonl per logged step.
    sample_rows: int = Field(4, ge=0)
    log_every_steps: int = Field(1, ge=1)

    @field_validator("run_name")
    @classmethod
    def _one_folder(cls, value: str | None) -> str | None:
        problem = None if value is None else run_name_problem(value)
        if problem:
            raise ValueError(problem)
        return value


class KernelsConfig(Strict):
    # torch.compile for the chunked head's and jsd's reductions (distill/kernels/compiled.py):
    # `auto` compiles on CUDA, `on` everywhere (the CPU too), `off` never.
    compile: Literal["auto", "on", "off"] = "auto"

    @field_validator("compile", mode="before")
    @classmethod
    def _yaml_switch(cls, value: Any) -> Any:
        # YAML (presets and `key=value` overrides) reads on/off as booleans.
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value


class RunConfig(Strict):
    # The domain's own model (registry.py), chosen by `name`; serialised with all its fields.
    domain: SerializeAsAny[DomainBase] = Field(default_factory=lambda: domain_config("rlve"))
    method: MethodConfig = Field(default_factory=OPDMethod)
    student: ModelConfig = Field(default_factory=lambda: ModelConfig(name="zoo:student"))
    teacher: ModelConfig = Field(default_factory=lambda: ModelConfig(name="zoo:teacher"))
    # A teacher per domain (`--teacher rlve=A --teacher dapo=B`): when given, it names every
    # domain's teacher and `teacher` stays unset. `zoo:teacher` is each domain's own zoo teacher.
    teachers: dict[str, ModelConfig] = Field(default_factory=dict)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    lora: LoRAConfig = Field(default_factory=LoRAConfig)
    kernels: KernelsConfig = Field(default_factory=KernelsConfig)
    # On-policy methods check prompts, masks and a zero-advantage self-score before training.
    preflight: bool = True
    seed: int = 0
    # torch intra-op threads; 0 leaves torch's default.
    threads: int = Field(0, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _own_teacher_is_the_student(cls, data: Any) -> Any:
        # OPSD has one model: its teacher is the student's own (step-0 / live / EMA) weights.
        method = data.get("method") if isinstance(data, dict) else None
        name = method.get("name") if isinstance(method, dict) else getattr(method, "name", None)
        if isinstance(name, str) and name in registry.METHODS and registry.METHODS[name].own_teacher:
            student = data.get("student") or {"name": "zoo:student"}
            student = student if isinstance(student, dict) else student.model_dump()
            weights = (
                method.get("teacher_weights", "base")
                if isinstance(method, dict)
                else getattr(method, "teacher_weights", "base")
            )
            own = _own_teacher(name, str(weights), student, data.get("teacher"))
            data = {**data, "teacher": own}
        return data

    @field_validator("domain", mode="wrap")
    @classmethod
    def _domain_model(cls, value: Any, handler: Any) -> Any:
        # The union of domain models is open (one registry line adds a domain): pick the model
        # by name, so its fields are checked and the errors point into `domain.`.
        if isinstance(value, dict):
            name = value.get("name", "rlve")
            try:
                registry.domain_entry(str(name))
            except ValueError as exc:
                raise ValueError(str(exc)) from None
            return domain_model(str(name)).model_validate(value)
        return handler(value)

    @model_validator(mode="after")
    def _student_is_local(self) -> RunConfig:
        # The student trains in this process; only the teacher can live behind a server.
        if self.student.engine == "server":
            raise ValueError("student.engine=server is not supported: the student trains locally (engine=hf)")
        if self.student.shard:
            raise ValueError(
                "student.shard: the launcher shards the student (configs/accelerate/fsdp.yaml, zero3.yaml)"
            )
        return self

    @model_validator(mode="after")
    def _method_fits_domain(self) -> RunConfig:
        """A method field means one thing on every domain: one the domain cannot honour is refused.

        A field counts as used when it differs from its default, so a saved config (every field
        written out) loads again."""
        episodic = registry.domain_entry(self.domain.name).episodic
        method, name = self.method, self.method.name
        entry = registry.method_entry(name)
        own, other = (
            (entry.episodic_fields, entry.single_turn_fields)
            if episodic
            else (entry.single_turn_fields, entry.episodic_fields)
        )
        for field in other:
            if getattr(method, field) != type(method).model_fields[field].default:
                kind = "multi-turn" if episodic else "single-turn"
                knobs = ", ".join(f"method.{f}" for f in own) or "the shared ones"
                raise ValueError(
                    f"method.{field} does not apply on the {kind} domain {self.domain.name}; its {name} "
                    f"knobs are {knobs}"
                )
        loss = getattr(method, "loss", None)
        supported = entry.episodic_losses
        if episodic and loss is not None and supported is not None and loss not in supported:
            raise ValueError(
                f"method.loss={loss}: on the multi-turn domain {self.domain.name} {name} supports "
                f"{' and '.join(supported)}"
            )
        return self

    @model_validator(mode="after")
    def _method_can_run(self) -> RunConfig:
        """What the method's entry says it cannot do (registry.py) is refused here: LoRA, and
        several domains, whose rows it would have to route to their own domain's teacher."""
        entry = registry.method_entry(self.method.name)
        if self.lora.enabled and not entry.lora:
            raise ValueError(f"lora.enabled: {self.method.name} trains all weights (set lora.enabled=false)")
        if len(registry.domain_parts(self.domain.name)) > 1 and not entry.multi_domain:
            able = ", ".join(m for m, e in registry.METHODS.items() if e.multi_domain)
            raise ValueError(
                f"method {self.method.name} trains on one domain per run (its rows would need their own "
                f"domain's teacher, not built yet); methods for {self.domain.name}: {able}"
            )
        several = len(registry.domain_parts(self.domain.name)) > 1 and not entry.own_teacher
        if several and getattr(self.method, "loss", None) == "jsd":
            # jsd applies one teacher's output head to the hidden states its rows were scored with.
            raise ValueError(
                f"method.loss=jsd: a run over {self.domain.name} has a teacher per domain, and jsd "
                "takes one teacher's head; use forward_kl_topk"
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _one_domains_teacher(cls, data: Any) -> Any:
        """`--domain rlve --teacher rlve=M` names a one-domain run's only teacher: it is `teacher`
        (every part of the run reads `teacher` where there is one domain)."""
        if not isinstance(data, dict) or data.get("teacher"):
            return data
        teachers, domain = data.get("teachers"), data.get("domain")
        name = domain.get("name") if isinstance(domain, dict) else getattr(domain, "name", None)
        if isinstance(teachers, dict) and isinstance(name, str) and list(teachers) == [name]:
            return {**data, "teacher": teachers[name], "teachers": {}}
        return data

    @model_validator(mode="after")
    def _a_teacher_per_domain(self) -> RunConfig:
        """`teachers` names each domain's teacher, once, and only where the method has a teacher
        of its own."""
        parts = registry.domain_parts(self.domain.name)
        entry = registry.method_entry(self.method.name)
        if not self.teachers:
            return self
        if entry.own_teacher:
            raise ValueError(f"teachers: {self.method.name}'s teacher is the student itself; drop teachers")
        unknown = [d for d in self.teachers if d not in parts]
        if unknown:
            raise ValueError(
                f"teachers.{unknown[0]}: {unknown[0]} is not a domain of this run ({', '.join(parts)})"
            )
        missing = [d for d in parts if d not in self.teachers]
        if missing:
            raise ValueError(
                f"domain {missing[0]} has no teacher (teachers names {', '.join(self.teachers)}): "
                f"add --teacher {missing[0]}=<model>"
            )
        if self.teacher != ModelConfig(name="zoo:teacher"):
            raise ValueError(
                f"two teachers for {parts[0]}: teacher={self.teacher.name} and teachers.{parts[0]}="
                f"{self.teachers[parts[0]].name}; name every domain's teacher as domain=model, or one teacher"
            )
        return self

    def teacher_sampling(self) -> Sampling:
        """How a writing or continuing teacher samples: SFT's trajectories (`rollout.max_new_tokens`
        at `method.temperature`), ROSE's continuations (at most `method.teacher_max_tokens` a turn
        at `method.teacher_temperature`); nucleus `rollout.top_p` for both."""
        method, rollout = self.method, self.rollout
        if isinstance(method, SFTMethod):
            return Sampling(rollout.max_new_tokens, method.temperature, rollout.top_p)
        if isinstance(method, ROSEMethod):
            return Sampling(method.teacher_max_tokens, method.teacher_temperature, rollout.top_p)
        raise ValueError(f"{method.name}'s teacher scores the student's tokens; it samples nothing")

    def teacher_of(self, domain: str) -> ModelConfig:
        """The teacher of one of the run's domains."""
        return self.teachers.get(domain, self.teacher)


# What an own teacher (OPSD) may set apart from the student: where its step-0 copy sits and in
# which precision. The live student has the student's; the EMA teacher averages the student's
# weights where they train (its precision may differ, its device may not).
OWN_TEACHER_FIELDS = {"base": ("device", "precision"), "ema": ("precision",), "live": ()}


def _own_teacher(method: str, weights: str, student: dict[str, Any], teacher: Any) -> dict[str, Any]:
    """The teacher section of a method whose teacher is the student itself: the student's, with
    the fields `OWN_TEACHER_FIELDS` lets the teacher keep; ValueError (one line) for any other
    field set to something else than the student's."""
    given = teacher if isinstance(teacher, dict) else {}
    if isinstance(teacher, ModelConfig):
        given = teacher.model_dump(include=teacher.model_fields_set)
    try:
        mine = ModelConfig.model_validate(student).model_dump()
    except ValidationError:  # the student's own error is reported where it is validated
        mine = dict(student)
    named = given.get("name")
    if named not in (None, mine.get("name")):
        raise ValueError(
            f"teacher.name={named} but {method}'s teacher is the student itself ({mine.get('name')}); "
            "drop teacher.name (method.teacher_weights picks base, live or ema weights)"
        )
    kept = OWN_TEACHER_FIELDS.get(weights, ())
    for key, value in given.items():
        if key == "name" or value == mine.get(key) or key in kept:
            continue
        if key in OWN_TEACHER_FIELDS["base"]:
            why = f"with method.teacher_weights={weights} it has the student's {key}"
        else:
            why = "only teacher.device and teacher.precision apply to it (its step-0 copy)"
        raise ValueError(
            f"teacher.{key}={value}: {method}'s teacher is the student itself, {why}; drop teacher.{key}"
        )
    return {**student, **{k: given[k] for k in kept if k in given}}


def format_validation_error(exc: ValidationError, prefix: str = "") -> str:
    parts = []
    # Union members show up in pydantic's locations as their tag (`method.opd.coef`): drop them.
    tags = set(registry.DOMAINS) | set(registry.METHODS)
    for err in exc.errors():
        loc = ".".join(
            ([prefix] if prefix else [])
            + [str(p) for p in err["loc"] if not (isinstance(p, str) and p in tags)]
        )
        # A validator's own message names its fields already ("method.x does not apply ...").
        msg = str(err["msg"]).removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "invalid config: " + "; ".join(parts)
