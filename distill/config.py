"""The run configuration: one pydantic model per concern, composed into `RunConfig`.

Every default lives here. Presets in `configs/<domain>/<method>.yaml` and dotted CLI overrides
(`optim.lr=1e-5`) are applied on top, then the whole thing is validated once. Nothing heavy is
imported here: `distill --help` and config errors must stay instant.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

Precision = Literal["fp32", "bf16", "fp16"]


class Strict(BaseModel):
    # coerce_numbers_to_str: `tracking.run_name=2024` arrives from YAML as an int.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, coerce_numbers_to_str=True)


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

    @model_validator(mode="after")
    def _server_needs_url(self) -> ModelConfig:
        if self.engine == "server" and not self.url:
            raise ValueError("engine=server needs url (e.g. teacher.url=http://127.0.0.1:8000)")
        return self


class DomainBase(Strict):
    """What every domain config has; each domain adds its own fields in its own model below."""

    train_size: int = Field(4096, ge=1)
    eval_size: int = Field(200, ge=1)
    # Eval items are drawn from a seed stream disjoint from training items.
    eval_seed: int = 1_000_003


class RLVEDomainConfig(DomainBase):
    name: Literal["rlve"] = "rlve"
    # rlve-gym environment identifiers and the difficulty parameter handed to generator().
    environments: list[str] = Field(default_factory=lambda: ["Sorting", "Multiplication"])
    parameters: dict[str, dict[str, Any]] = Field(
        default_factory=lambda: {"Sorting": {"N": 3}, "Multiplication": {"digit_num": 1}}
    )


class SciWorldDomainConfig(DomainBase):
    """ScienceWorld episodes in the AgentGym format (distill/domains/sciworld/)."""

    name: Literal["sciworld"] = "sciworld"
    # Episodes are slow to materialise (a gold play each): smaller sets than single-turn domains.
    train_size: int = Field(512, ge=1)
    eval_size: int = Field(40, ge=1)
    # ScienceWorld task ids (env.tasks keys) of the embedded items; train items come from the
    # simulator's train variations (and its dev variations with `train_on_dev`), eval items
    # from its test variations. The default pair's task texts never vary: a 2-layer teacher
    # does not read a detail back from the task text (4-2's box colour, 7-2's "shortest"),
    # and 7-3's second focus follows from the episode going on (docs/sciworld.md).
    tasks: list[str] = Field(default_factory=lambda: ["7-1", "7-3"])
    train_on_dev: bool = True
    # Insert "look around" before a gold "focus on" that follows a move: ScienceWorld's gold
    # paths often focus on something in a room they just entered without looking, so a model
    # imitating them would have to guess the object's name.
    gold_look: bool = True
    # Environment worker processes, one JVM each; episodes run in parallel across them.
    pool_size: int = Field(2, ge=1)
    # Heap cap of each JVM, passed as JAVA_TOOL_OPTIONS=-Xmx<java_heap>.
    java_heap: str = Field("1g", pattern=r"^[0-9]+[kKmMgG]$")
    max_turns: int = Field(20, ge=1)
    # Token budget of one assistant turn.
    turn_max_new_tokens: int = Field(64, ge=1)
    # The simulator ends an episode after this many moves (its envStepLimit).
    env_step_limit: int = Field(100, ge=1)
    # A final score of -100 (irreversible failure): "zero" counts it as 0, "keep" as -100.
    negative_score: Literal["zero", "keep"] = "zero"
    # Seconds one reset/step may take before its worker counts as hung and is restarted.
    step_timeout_s: float = Field(120.0, gt=0)
    # ROSE on episodes: the student plays the first N turns, N drawn per episode from
    # [student_turns_min, student_turns] (student_turns_min None: N fixed), then the teacher.
    student_turns: int = Field(2, ge=0)
    student_turns_min: int | None = Field(0, ge=0)


class DapoDomainConfig(DomainBase):
    """Math with a boxed final answer graded by math-verify (distill/domains/dapo/)."""

    name: Literal["dapo"] = "dapo"
    # Training problems: a hub id (e.g. BytedTsinghua-SIA/DAPO-Math-17k), a local parquet/jsonl/json
    # file or folder (verl, RLVE or plain problem/answer rows); None: the embedded generated problems.
    data: str | None = None
    # Eval items: a benchmark (aime25, hmmt25, aime24) read from `eval_data` (file or folder) or
    # its hub id; None: held-out problems of the training source.
    eval_benchmark: str | None = None
    eval_data: str | None = None
    # Shuffles the loaded training problems (after deduplication by problem text).
    seed: int = 0
    # The embedded generator: operations per problem and the largest intermediate value.
    min_steps: int = Field(2, ge=1)
    max_steps: int = Field(4, ge=1)
    max_value: int = Field(20, ge=10)
    # math-verify worker processes and the per-item timeout of its parse/verify calls.
    grade_workers: int = Field(2, ge=1)
    grade_timeout_s: int = Field(5, ge=1)

    @model_validator(mode="after")
    def _consistent(self) -> DapoDomainConfig:
        from distill.evals.benchmarks import BENCHMARKS

        if self.max_steps < self.min_steps:
            raise ValueError(f"max_steps ({self.max_steps}) must be >= min_steps ({self.min_steps})")
        if self.eval_benchmark is not None and self.eval_benchmark not in BENCHMARKS:
            raise ValueError(
                f"unknown eval_benchmark {self.eval_benchmark!r}; known: {', '.join(BENCHMARKS)}"
            )
        if self.eval_data is not None and self.eval_benchmark is None:
            raise ValueError("eval_data needs eval_benchmark (the benchmark those problems are)")
        return self


# One model per domain, chosen by `name` (the registry key); add a domain's model to this union.
DomainConfig = Annotated[
    RLVEDomainConfig | SciWorldDomainConfig | DapoDomainConfig, Field(discriminator="name")
]


def domain_config(name: str, **fields: Any) -> DomainConfig:
    """A domain's config from its name and fields (validated like the `domain:` section)."""
    from pydantic import TypeAdapter

    domains, _ = _known()
    if name not in domains:
        raise ConfigError(f"unknown domain {name!r}; known: {', '.join(domains)}")
    try:
        return TypeAdapter(DomainConfig).validate_python({"name": name, **fields})
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, prefix="domain")) from None


class SFTMethod(Strict):
    name: Literal["sft"] = "sft"
    # Keep only teacher trajectories the verifier accepts.
    keep_verified_only: bool = True
    # Teacher trajectories written per training prompt.
    samples_per_prompt: int = Field(1, ge=1)
    # Teacher sampling temperature for its trajectories; 0 is greedy.
    temperature: float = Field(0.0, ge=0)
    epochs: float = Field(1.0, gt=0)


class OnPolicyKL(Strict):
    """What OPD and OPSD share: the student samples, a teacher scores the same token ids."""

    # token_reward_direct: A_t = coef * (logp_teacher - logp_student) into the policy-gradient loss,
    # not normalised. k1, k3/low_var_kl: direct KL losses on sampled tokens. forward_kl_topk:
    # KL(teacher || student) over the teacher's top_k. jsd: full-vocabulary generalised JSD (beta).
    loss: Literal["token_reward_direct", "k1", "k3", "low_var_kl", "forward_kl_topk", "jsd"] = (
        "token_reward_direct"
    )
    coef: float = 1.0
    # Optional symmetric clamp of the advantage; None keeps the reference semantics.
    advantage_clip: float | None = Field(None, gt=0)
    top_k: int = Field(20, ge=1)
    # forward_kl_topk: match the teacher's mass outside its top-k as one tail bucket.
    topk_tail: bool = True
    # jsd: 0 forward KL, 1 reverse KL, in between generalised JSD (TRL's convention).
    beta: float = Field(0.5, ge=0, le=1)


class OPDMethod(OnPolicyKL):
    name: Literal["opd"] = "opd"


# The reference document's privileged teacher prompt (OPSD): problem, reference solution, transition.
OPSD_TEMPLATE = (
    "Problem: {problem}\n\n"
    "Here is a reference solution to this problem:\n"
    "=== Reference Solution Begin ===\n"
    "{solution}\n"
    "=== Reference Solution End ===\n\n\n"
    "After understanding the reference solution and the rationale behind each step, now articulate your "
    "own step-by-step reasoning that derives the same final answer to the problem above."
)


class OPSDMethod(OnPolicyKL):
    """One model is student and teacher; the teacher's prompt carries a privileged solution."""

    name: Literal["opsd"] = "opsd"
    # The teacher's user message; {problem} is the student's prompt, {solution} the domain's
    # privileged context (worked solution, else the reference answer).
    teacher_template: str = OPSD_TEMPLATE
    # base: frozen step-0 weights; live: the student being trained; ema: an average of the student.
    teacher_weights: Literal["base", "live", "ema"] = "base"
    ema_decay: float = Field(0.99, gt=0, lt=1)


class ROSEMethod(Strict):
    """The student writes a prefix of K tokens (mask 0), the teacher continues it for at most
    t tokens in the same assistant turn (mask 1), CE on the teacher's tokens only."""

    name: Literal["rose"] = "rose"
    # K in student tokens; with prefix_tokens_min set, the upper end of K's range.
    prefix_tokens: int = Field(64, ge=0)
    # Draw K uniformly from [prefix_tokens_min, prefix_tokens] per sample (capped at the student's
    # response); None: K is fixed. A fixed K never trains the first K positions, which then drift.
    prefix_tokens_min: int | None = Field(0, ge=0)
    # Cut at this fraction of the student's full response instead (overrides prefix_tokens).
    prefix_fraction: float | None = Field(None, ge=0, le=1)
    # t: the teacher's continuation budget, in teacher tokens.
    teacher_max_tokens: int = Field(64, ge=1)
    # Teacher sampling temperature for its continuation; 0 is greedy.
    teacher_temperature: float = Field(0.0, ge=0)

    @model_validator(mode="after")
    def _range(self) -> ROSEMethod:
        if self.prefix_tokens_min is not None and self.prefix_tokens_min > self.prefix_tokens:
            raise ValueError(
                f"prefix_tokens_min ({self.prefix_tokens_min}) is above prefix_tokens ({self.prefix_tokens})"
            )
        return self


MethodConfig = Annotated[SFTMethod | OPDMethod | OPSDMethod | ROSEMethod, Field(discriminator="name")]


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


class CheckpointConfig(Strict):
    # 0: only the final checkpoint.
    every_steps: int = Field(25, ge=0)


class TrackingConfig(Strict):
    experiment: str = "distill"
    run_name: str | None = None
    # None: DISTILL_TRACKING_URI, else the embedded sqlite store in the workspace.
    uri: str | None = None
    # Rollouts written to samples/step-N.jsonl per logged step.
    sample_rows: int = Field(4, ge=0)
    log_every_steps: int = Field(1, ge=1)


class RunConfig(Strict):
    domain: DomainConfig = Field(default_factory=RLVEDomainConfig)
    method: MethodConfig = Field(default_factory=OPDMethod)
    student: ModelConfig = Field(default_factory=lambda: ModelConfig(name="zoo:student"))
    teacher: ModelConfig = Field(default_factory=lambda: ModelConfig(name="zoo:teacher"))
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    lora: LoRAConfig = Field(default_factory=LoRAConfig)
    # On-policy methods check prompts, masks and a zero-advantage self-score before training.
    preflight: bool = True
    seed: int = 0
    # torch intra-op threads; 0 leaves torch's default.
    threads: int = Field(0, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _opsd_teacher_is_the_student(cls, data: Any) -> Any:
        # OPSD has one model: its teacher is the student's own (step-0 / live / EMA) weights.
        if (
            isinstance(data, dict)
            and isinstance(data.get("method"), dict)
            and data["method"].get("name") == "opsd"
        ):
            student = data.get("student") or {"name": "zoo:student"}
            student = student if isinstance(student, dict) else student.model_dump()
            teacher = data.get("teacher")
            named = teacher.get("name") if isinstance(teacher, dict) else getattr(teacher, "name", None)
            if named not in (None, student.get("name")):
                raise ValueError(
                    f"teacher.name={named} but opsd's teacher is the student itself ({student.get('name')}); "
                    "drop teacher.name (method.teacher_weights picks base, live or ema weights)"
                )
            data = {**data, "teacher": dict(student)}
        return data

    @model_validator(mode="after")
    def _student_is_local(self) -> RunConfig:
        # The student trains in this process; only the teacher can live behind a server.
        if self.student.engine == "server":
            raise ValueError("student.engine=server is not supported: the student trains locally (engine=hf)")
        if self.teacher.engine == "server":
            from distill.engines.server import unsupported_reason

            reason = unsupported_reason(self)
            if reason:
                raise ValueError(f"teacher.engine=server: {reason}")
        from distill.engines import vllm

        reason = vllm.unsupported_reason(self, check_install=False)
        if reason:
            raise ValueError(reason)
        return self


class ConfigError(ValueError):
    """A one-line, user-facing configuration error (CLI exit code 2)."""


def _known() -> tuple[tuple[str, ...], tuple[str, ...]]:
    from distill.domains import REGISTRY as domains
    from distill.methods import REGISTRY as methods

    return tuple(domains), tuple(methods)


def presets_dir() -> Path:
    return Path(__file__).resolve().parent.parent / "configs"


def preset_path(domain: str, method: str) -> Path:
    return presets_dir() / domain / f"{method}.yaml"


def read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"config file {path}{where} is not valid YAML") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return data


def parse_override(text: str) -> tuple[list[str], Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r} is not of the form section.key=value")
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {key}: cannot parse value {raw!r}") from exc
    return key.split("."), value


def set_dotted(data: dict[str, Any], path: list[str], value: Any) -> None:
    node = data
    for i, part in enumerate(path[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"override {'.'.join(path)}: {'.'.join(path[: i + 1])} is not a section")
        node = child
    node[path[-1]] = value


def deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def format_validation_error(exc: ValidationError, prefix: str = "") -> str:
    parts = []
    # Union members show up in pydantic's locations as their tag (`method.opd.coef`): drop them.
    domains, methods = _known()
    tags = set(domains) | set(methods)
    for err in exc.errors():
        loc = ".".join(
            ([prefix] if prefix else [])
            + [str(p) for p in err["loc"] if not (isinstance(p, str) and p in tags)]
        )
        parts.append(f"{loc or '<root>'}: {err['msg']}")
    return "invalid config: " + "; ".join(parts)


def resolve_config(
    domain: str | None = None,
    method: str | None = None,
    config_file: Path | None = None,
    overrides: list[str] | None = None,
) -> RunConfig:
    """Schema defaults <- preset for (domain, method) <- --config file <- dotted overrides."""
    data: dict[str, Any] = {}
    if config_file is not None:
        file_data = read_yaml(config_file)
    else:
        file_data = {}
    parsed = [parse_override(text) for text in overrides or []]
    # domain.name / method.name given as overrides choose the preset like --domain / --method.
    named = {
        ".".join(path): value for path, value in parsed if path in (["domain", "name"], ["method", "name"])
    }
    domain = domain or named.get("domain.name") or _dig(file_data, "domain", "name") or "rlve"
    method = method or named.get("method.name") or _dig(file_data, "method", "name") or "opd"
    domains, methods = _known()
    if domain not in domains:
        raise ConfigError(f"unknown domain {domain!r}; known: {', '.join(domains)}")
    if method not in methods:
        raise ConfigError(f"unknown method {method!r}; known: {', '.join(methods)}")
    preset = preset_path(domain, method)
    if preset.exists():
        data = read_yaml(preset)
    data = deep_merge(data, file_data)
    data = deep_merge(data, {"domain": {"name": domain}, "method": {"name": method}})
    for path, value in parsed:
        set_dotted(data, path, value)
    for role in ("student", "teacher"):
        # `teacher.engine=server teacher.url=...` alone keeps the schema's default model, as any
        # other partial override does (opsd's teacher is the student: RunConfig fills it).
        spec = data.get(role)
        if isinstance(spec, dict) and "name" not in spec and not (role == "teacher" and method == "opsd"):
            spec["name"] = f"zoo:{role}"
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from None


def _dig(data: dict[str, Any], *keys: str) -> Any:
    node: Any = data
    for key in keys:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"optim": {"lr": 1e-4}}` -> `{"optim.lr": 1e-4}` (MLflow params)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def dump_config(config: RunConfig, path: Path) -> None:
    path.write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))


def load_run_config(path: Path) -> RunConfig:
    try:
        return RunConfig.model_validate(read_yaml(path))
    except ValidationError as exc:
        raise ConfigError(f"{path}: " + format_validation_error(exc)) from None
