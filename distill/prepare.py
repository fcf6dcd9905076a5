"""What a run loads and checks before its first step: the method, the domain, the engines, the
token budgets and the preflight checks (runner.py runs them in order; `distill run --preflight`
runs them alone and trains nothing)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distill import launch, registry
from distill.config import OPDMethod
from distill.domains import build_domain
from distill.domains.mixed import MixedDomain
from distill.engines.hf import HFEngine
from distill.engines.placement import Role, cpu_note, place, this_machine
from distill.engines.server import ServerEngine
from distill.engines.templates import apply_chat_template
from distill.engines.worker import WorkerEngine
from distill.kernels import compiled
from distill.kernels.sharded import shard_for_inference
from distill.methods import get_method
from distill.methods.budget import context_checks
from distill.methods.cross_family import crosses
from distill.methods.cross_family import warning as cross_warning
from distill.methods.pair import check_tokenizers
from distill.methods.preflight import REFERENCE_MAX_BYTES, preflight_report
from distill.settings import get_settings
from distill.zoo import PREFIX as ZOO
from distill.zoo import resolve_model
from distill.zoo.check import build_inputs, check_models

if TYPE_CHECKING:
    from distill.config import ModelConfig, RunConfig
    from distill.domains.base import Domain
    from distill.engines.base import Engine
    from distill.methods.context import RunContext
    from distill.settings import Settings
    from distill.tracking.rundir import RunDir

Say = Callable[[str], Any]  # prints a line for the user


def load_engine(
    spec: ModelConfig,
    config: RunConfig,
    settings: Settings,
    part: str | None = None,
    role: Role = "teacher",
    worker: tuple[int, int] | None = None,
) -> Engine:
    """The student's or teacher's engine on the device its config and the machine give it
    (engines/placement.py), with the chat template it renders with (engines/templates.py): a
    zoo name is built on first use (`part`: the domain of a mixed run the teacher serves:
    `zoo:teacher` is that domain's). `worker`: (index, count) of a teacher that scores in its
    own worker process (`worker_slots`): its weights are loaded there, not here."""
    path = resolve_model(spec.name, config.domain, settings, part=part)
    engine: Engine
    if spec.engine == "server":  # engines/compat.py has checked the method can use a served teacher
        engine = ServerEngine.load(path, str(spec.url), spec.server, spec.enable_thinking)
    elif worker is not None:
        device = place(spec.device, "teacher_worker", this_machine(), worker=worker)
        # It loads while the rest of the run is set up; the first question about it waits.
        engine = WorkerEngine(
            path, spec.precision, spec.enable_thinking, config.threads, wait=False, device=device
        )
    else:
        device = place(spec.device, role, this_machine())
        if spec.shard and launch.sharded() and launch.world_size() > 1:
            # `teacher.shard=true` (teacher_shard.py has refused what it cannot run under): loaded
            # in host memory, then split over the ranks, each moving only its shard (and one
            # layer at a time while splitting) to its device; a one-process preflight keeps it whole.
            engine = HFEngine.load(path, spec.precision, spec.enable_thinking, device="cpu")
            engine.model = shard_for_inference(engine.model, launch.strategy())
        else:
            engine = HFEngine.load(path, spec.precision, spec.enable_thinking, device=device)
    apply_chat_template(
        engine.tokenizer, spec.chat_template, spec.name, "student" if role == "student" else "teacher"
    )
    return engine


def worker_slots(config: RunConfig) -> dict[str, tuple[int, int]]:
    """The domains whose teacher scores in its own worker process (`rollout.async_teacher` with
    an hf teacher), each with (its worker's index, the workers a trainer process starts): one
    worker a teacher, shared by the domains it teaches. Empty when no teacher does."""
    from distill.zoo.build import PART

    if not config.rollout.async_teacher or registry.method_entry(config.method.name).own_teacher:
        return {}
    parts = registry.domain_parts(config.domain.name)
    keys: dict[str, str] = {}
    for part in parts:
        spec = config.teacher_of(part)
        if spec.engine == "hf":
            # A zoo name in a run over several domains is each domain's own model (resolve_model).
            own = len(parts) > 1 and spec.name.startswith(ZOO) and PART not in spec.name
            keys[part] = spec.model_dump_json() + (f"{PART}{part}" if own else "")
    distinct = list(dict.fromkeys(keys.values()))
    return {part: (distinct.index(key), len(distinct)) for part, key in keys.items()}


def model_devices(config: RunConfig) -> dict[str, str]:
    """Where each model of the run goes (`student.device`, `teacher.device`, a teacher's worker
    process's device where it scores in one); PlacementError, a ConfigError, when the machine
    cannot honour a field (checked before a run directory exists)."""
    machine = this_machine()
    out = {"student.device": place(config.student.device, "student", machine)}
    slots = worker_slots(config)
    # An own teacher (opsd) is a copy of the student's weights, placed as a teacher, unless it is
    # the live student itself.
    live = registry.method_entry(config.method.name).own_teacher and (
        getattr(config.method, "teacher_weights", "live") == "live"
    )
    for part, spec in (config.teachers or {"": config.teacher}).items():
        if spec.engine == "hf" and not live:
            field = f"teachers.{part}.device" if part else "teacher.device"
            # `teacher` of every domain: each domain's worker where they differ (zoo:teacher).
            mine = [slot for p, slot in slots.items() if p == part or not part]
            placed = [place(spec.device, "teacher_worker", machine, field, worker=slot) for slot in mine]
            out[field] = placed[0] if placed else place(spec.device, "teacher", machine, field)
    return out


def check_pair(config: RunConfig, settings: Settings) -> None:
    """What the pair's tokenizers alone decide (methods/pair.py), before a run directory exists:
    loads their tokenizers, not their weights. A zoo model not built yet is checked when the run
    loads it (the zoo's own pairs are known to cross cleanly)."""
    from transformers import AutoTokenizer

    entry = registry.method_entry(config.method.name)
    # Only a loss of one shared vocabulary (jsd) and a continuing teacher (its bridge) can be
    # refused by the tokenizers; reading a 150k-token vocabulary costs seconds, so nothing else does.
    if not (entry.teacher == "continues" or getattr(config.method, "loss", None) == "jsd"):
        return
    parts = registry.domain_parts(config.domain.name)
    specs = {"": config.student, **{p: config.teacher_of(p) for p in parts}}
    paths = {k: _built(spec.name, config, settings, k or None) for k, spec in specs.items()}
    if any(path is None for path in paths.values()):
        return
    tokenizers = {k: AutoTokenizer.from_pretrained(str(path)) for k, path in paths.items()}
    student = tokenizers.pop("")
    domain = build_domain(config.domain)
    try:
        check_tokenizers(config, student, tokenizers, domain)
    finally:
        domain.close()


def _built(name: str, config: RunConfig, settings: Settings, part: str | None) -> str | None:
    """A model's local path or hub id; for a zoo name its entry when built, else None."""
    if not name.startswith(ZOO):
        return name
    try:
        path = resolve_model(name, config.domain, settings, show_progress=False, part=part, build=False)
    except FileNotFoundError:
        return None
    return path


def device_note(config: RunConfig) -> str | None:
    """The one line said at start when a model stays on the CPU beside a GPU (None otherwise)."""
    return cpu_note(model_devices(config), this_machine())


def load_student(config: RunConfig, settings: Settings) -> HFEngine:
    """The student trains in this process: always the hf engine (the config refuses a server)."""
    engine = load_engine(config.student, config, settings, role="student")
    if not isinstance(engine, HFEngine):
        raise ValueError("student.engine: the student trains in this process (engine=hf)")
    return engine


@dataclass
class Prepared:
    """A run's method, domain and engines, loaded. `teachers`: each domain's teacher in a run over
    several domains (`teacher` is the first's); empty for one domain."""

    train: Callable[[RunContext], None]
    domain: Domain
    student: HFEngine
    teacher: Engine
    teachers: dict[str, Engine]


def load_teachers(config: RunConfig, settings: Settings, workers: bool = True) -> dict[str, Engine]:
    """Each domain's teacher of a run over several domains, each loaded once (two domains with
    one teacher share its engine); empty for a one-domain run. `workers`: a teacher that scores
    in its worker process (`worker_slots`) is loaded there; False: every one in this process."""
    parts = registry.domain_parts(config.domain.name)
    if len(parts) == 1:
        return {}
    own = registry.method_entry(config.method.name).own_teacher
    slots = worker_slots(config) if workers else {}
    loaded: dict[tuple[str, str], Engine] = {}
    out: dict[str, Engine] = {}
    for part in parts:
        spec = config.teacher_of(part)
        # An own teacher (opsd) is the student's weights: one engine, whatever the domain.
        path = spec.name if own else resolve_model(spec.name, config.domain, settings, part=part)
        key = (path, spec.model_dump_json())
        if key not in loaded:
            named = spec.model_copy(update={"name": path})
            loaded[key] = load_engine(named, config, settings, worker=slots.get(part))
        out[part] = loaded[key]
    return out


def load_teacher(config: RunConfig, settings: Settings, workers: bool = True) -> Engine:
    """A one-domain run's teacher (in its worker process where it scores there: `load_teachers`)."""
    slot = worker_slots(config).get(config.domain.name) if workers else None
    return load_engine(config.teacher, config, settings, worker=slot)


def prepare(config: RunConfig, settings: Settings) -> Prepared:
    """What every process of a run does first: quiet libraries, seed, method, domain, engines."""
    import torch
    import transformers
    from transformers import set_seed

    # Library deprecation chatter from inside TRL/transformers is not the user's to act on.
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    set_seed(config.seed)
    train = get_method(config.method.name, config.domain.name)  # a method the domain lacks fails here
    domain = build_domain(config.domain)
    try:
        student = load_student(config, settings)
        teachers = load_teachers(config, settings)
        teacher = next(iter(teachers.values())) if teachers else load_teacher(config, settings)
    except BaseException:
        domain.close()
        raise
    # After the engines load: a zoo build (inside load_engine) keeps torch's default threads, so
    # the cached zoo models are the same whatever `threads` a run asks for.
    if config.threads:
        torch.set_num_threads(config.threads)
    compiled.set_mode(config.kernels.compile)
    return Prepared(train, domain, student, teacher, teachers)


def each_teacher(
    config: RunConfig, domain: Domain, teacher: Engine, teachers: dict[str, Engine] | None = None
) -> list[tuple[str, RunConfig, Domain, Engine]]:
    """(domain word, the config as that domain's own run with its teacher, the domain, its teacher
    engine) for every domain of the run: the checks of one pair run once per domain's teacher."""
    if not teachers or not isinstance(domain, MixedDomain):
        return [(config.domain.name, config, domain, teacher)]
    sections: dict[str, Any] = getattr(config.domain, "parts", {})
    return [
        (
            part,
            config.model_copy(
                update={"domain": sections[part], "teacher": config.teacher_of(part), "teachers": {}}
            ),
            sub,
            teachers[part],
        )
        for part, sub in domain.parts().items()
    ]


def budget_warnings(
    config: RunConfig,
    domain: Domain,
    student: Engine,
    teacher: Engine,
    teachers: dict[str, Engine] | None = None,
) -> list[str]:
    """Token budgets against the models' contexts (engines/context.py): capped with a warning, or
    a one-line error before anything is generated. Also the warning of cross-family OPD on a
    sampled-token loss (docs/cross_family.md). Each domain's prompts against its own teacher."""
    found: list[str] = []
    pairs = each_teacher(config, domain, teacher, teachers)
    for part, cfg, sub, engine in pairs:
        where = f"{part}: " if len(pairs) > 1 else ""
        found += [where + w for check in context_checks(cfg, sub, student, engine) if (w := check.warning())]
        if isinstance(cfg.method, OPDMethod) and crosses(cfg, student, engine):
            if note := cross_warning(cfg.method, cfg.student.name, cfg.teacher.name):
                found.append(where + note)
    return list(dict.fromkeys(found))


def preflight(
    config: RunConfig,
    domain: Domain,
    student: HFEngine,
    teacher: Engine,
    say: Say,
    run: RunDir | None = None,
    teachers: dict[str, Engine] | None = None,
) -> str | None:
    """Template / thinking / self-score checks for on-policy methods, each domain's teacher on its
    own domain's prompts; raises PreflightError. A run keeps the report, passed or failed, in
    `preflight.json` (what diagnose reads; each domain's under `parts.<domain>`)."""
    texts: list[str] = []
    pairs = each_teacher(config, domain, teacher, teachers)
    for part, cfg, sub, engine in pairs:
        served = cfg.teacher.engine == "server"
        reference = (lambda c=cfg, e=engine: local_reference(c, e)) if served else None
        report = preflight_report(cfg, sub, student, engine, run, reference, part if len(pairs) > 1 else None)
        if report is None:
            continue
        texts.append(report.render())
        say(f"preflight{f' ({part})' if len(pairs) > 1 else ''}:\n" + texts[-1])
    return "\n".join(texts) if texts else None


def local_reference(config: RunConfig, teacher: Engine) -> Engine | None:
    """A served teacher's weights loaded in this process, for the preflight's reference pass;
    None when they are not a local folder small enough to load beside the run."""
    folder = Path(str(teacher.describe().get("path", "")))
    weights = [*folder.glob("*.safetensors"), *folder.glob("*.bin")] if folder.is_dir() else []
    if not weights or sum(f.stat().st_size for f in weights) > REFERENCE_MAX_BYTES:
        return None
    spec = config.teacher.model_copy(update={"engine": "hf", "url": None, "name": str(folder)})
    return load_engine(spec, config, get_settings())


def preflight_only(config: RunConfig, settings: Settings, say: Say) -> str:
    """`distill run --preflight`: load the pair, run the checks, train nothing, write nothing."""
    check_models(config)  # a model or template that cannot load fails in one line, first
    build_inputs(config, settings)  # items and zoo models, in one line when they cannot be made
    check_pair(config, settings)
    if note := device_note(config):
        say(note)
    domain = build_domain(config.domain)
    try:
        student = load_student(config, settings)
        # Nothing is scored ahead here: every teacher in this process, workers or not.
        teachers = load_teachers(config, settings, workers=False)
        teacher = next(iter(teachers.values())) if teachers else load_teacher(config, settings, workers=False)
        checked = config.model_copy(update={"preflight": True})
        text = preflight(checked, domain, student, teacher, say, teachers=teachers)
    finally:
        domain.close()
    if text is None:
        say(f"preflight: nothing to check for method {config.method.name} (no teacher scores student tokens)")
        return ""
    return text
