"""Is a model name usable, checked in a second before anything is created or loaded.

A run or an eval names its models as `zoo:<name>`, a local folder or a Hugging Face id. Loading
one costs seconds to minutes (torch, transformers, a zoo build, a hub download that retries), so a
typo used to surface only after a run directory and an MLflow run existed. Here each name is
checked on its own terms: a zoo name against the domain's recipes, a folder for the files a model
and its tokenizer need, a hub id against the local cache (offline) or the hub (online).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from distill.config import ConfigError
from distill.engines.templates import TemplateError, missing_template, read_template
from distill.zoo import PREFIX

if TYPE_CHECKING:
    from distill.config import ModelConfig, RunConfig
    from distill.settings import Settings

# Any one of these makes a folder a tokenizer folder (fast tokenizers, slow ones, BPE vocabularies).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
# A full model, or a LoRA checkpoint whose adapters are merged onto their base on load.
MODEL_FILES = ("config.json", "adapter_config.json")
# Seconds an online existence check of a hub id may take before it counts as unreachable.
HUB_TIMEOUT_S = 10.0
# Where a tokenizer keeps its chat template: a key of tokenizer_config.json, or a file of its own.
TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")


def is_path_like(name: str) -> bool:
    """A name that can only mean a local path: it starts like one, or names more than org/model."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or Path(name).expanduser().exists()


def check_folder(path: Path, label: str, tokenizer_only: bool = False) -> None:
    """One line naming the folder and what it lacks; nothing when it holds a model (and tokenizer)."""
    if not path.exists():
        raise ConfigError(f"{label}: no such folder {path}")
    if not path.is_dir():
        raise ConfigError(f"{label}: {path} is a file, not a model folder")
    has_tokenizer = any((path / name).exists() for name in TOKENIZER_FILES)
    if tokenizer_only:
        if not has_tokenizer:
            raise ConfigError(
                f"{label}: {path} is not a tokenizer folder (none of {', '.join(TOKENIZER_FILES)})"
            )
        return
    has_model = any((path / name).exists() for name in MODEL_FILES)
    if not has_model or not has_tokenizer:
        missing = [] if has_model else ["config.json"]
        missing += [] if has_tokenizer else ["tokenizer (tokenizer.json or tokenizer_config.json)"]
        raise ConfigError(f"{label}: {path} is not a model folder: it has no {' and no '.join(missing)}")


def check_hub_id(name: str, label: str) -> None:
    """A hub id: cached locally, or (online) known to the hub; offline and not cached is an error."""
    from huggingface_hub import constants, try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    try:
        cached = try_to_load_from_cache(name, "config.json")
    except HFValidationError:
        raise ConfigError(
            f"{label}: {name!r} is neither a local folder nor a Hugging Face model id"
        ) from None
    if isinstance(cached, str):
        return
    if constants.HF_HUB_OFFLINE:
        raise ConfigError(
            f"{label}: {name} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set; "
            "download it first or give a local folder"
        )
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        HfApi().model_info(name, timeout=HUB_TIMEOUT_S)
    except GatedRepoError:
        return  # it exists; the download says whether this machine's token may read it
    except RepositoryNotFoundError:
        raise ConfigError(f"{label}: no model {name} on the Hugging Face hub (nor a local folder)") from None
    except Exception as exc:  # a network that is down, a proxy, a timeout: all mean "cannot fetch"
        raise ConfigError(
            f"{label}: {name} is not in the local Hugging Face cache and the hub is out of reach "
            f"({type(exc).__name__}); download it first or give a local folder"
        ) from None


def check_model_name(name: str, domain: str, label: str, tokenizer_only: bool = False) -> None:
    """Raise ConfigError (one line, starting with `label`) unless `name` can be loaded."""
    if not name.strip():
        raise ConfigError(f"{label}: empty model name")
    if name.startswith(PREFIX):
        from distill.zoo.recipes import recipes_for

        known = recipes_for(domain)
        if name[len(PREFIX) :] not in known:
            raise ConfigError(
                f"{label}: unknown zoo model {name!r}; known: {', '.join(PREFIX + k for k in sorted(known))}"
            )
        return
    if is_path_like(name):
        check_folder(Path(name).expanduser(), label, tokenizer_only)
        return
    check_hub_id(name, label)


def folder_has_template(path: Path) -> bool:
    """Whether a tokenizer folder carries a chat template (read from its files, nothing loaded)."""
    import json

    if (
        any((path / name).is_file() for name in TEMPLATE_FILES)
        or (path / "additional_chat_templates").is_dir()
    ):
        return True
    config = path / "tokenizer_config.json"
    try:
        data = json.loads(config.read_text()) if config.is_file() else {}
    except (OSError, ValueError):
        return True  # unreadable here: the load says what is wrong with it
    return bool(data.get("chat_template"))


def hub_has_template(name: str) -> bool | None:
    """A cached hub id's template, from its cached files; None when not cached (nothing known)."""
    import json

    from huggingface_hub import try_to_load_from_cache

    config = try_to_load_from_cache(name, "tokenizer_config.json")
    if not isinstance(config, str):
        return None
    if any(isinstance(try_to_load_from_cache(name, f), str) for f in TEMPLATE_FILES):
        return True
    try:
        return bool(json.loads(Path(config).read_text()).get("chat_template"))
    except (OSError, ValueError):
        return None


def check_template(spec: ModelConfig, role: str) -> None:
    """ConfigError (one line) when the model's chat template is a named file that is not a usable
    template, or when it has none and names none. Zoo tokenizers always carry theirs."""
    if spec.chat_template is not None:
        try:
            read_template(spec.chat_template, f"{role}.chat_template")
        except TemplateError as exc:
            raise ConfigError(str(exc)) from None
        return
    name = spec.name
    if name.startswith(PREFIX):
        return
    if is_path_like(name):
        has = folder_has_template(Path(name).expanduser())
    else:
        has = hub_has_template(name) is not False
    if not has:
        raise ConfigError(missing_template(name, role))


def check_models(config: RunConfig) -> None:
    """The student and the teacher of a run, before its directory or MLflow run exists: each
    name loadable, and each model's chat template there or named (`<role>.chat_template`)."""
    domain = config.domain.name
    check_model_name(config.student.name, domain, "student.name")
    check_template(config.student, "student")
    # A teacher per domain replaces `teacher` (a run over several domains, config.teachers).
    teachers = {f"teachers.{d}": t for d, t in config.teachers.items()} or {"teacher": config.teacher}
    for field, spec in teachers.items():
        if spec.name != config.student.name:
            # A served teacher's weights live on the server; only its tokenizer is loaded here.
            served = spec.engine == "server"
            check_model_name(spec.name, domain, f"{field}.name", tokenizer_only=served)
        check_template(spec, field)


def build_inputs(config: RunConfig, settings: Settings) -> None:
    """What a run reads before its first step, made before its folder exists: the domain's items
    (generated or loaded, and cached in the workspace, where the run finds them again) and the zoo
    models it names (built and cached). A failure there is the run's input, not the run: an
    environment that makes too few items, a data file without problems, a zoo folder that cannot
    be written. ConfigError: one line, the run never starts."""
    from distill.domains import build_domain
    from distill.zoo import resolve_model

    try:
        domain = build_domain(config.domain)
        try:
            domain.eval_items()
            domain.train_items()
        finally:
            domain.close()
        for name, part in zoo_models(config):
            resolve_model(name, config.domain, settings, part=part)
    except (ValueError, OSError) as exc:
        lines = str(exc).strip().splitlines() or [type(exc).__name__]
        raise ConfigError(lines[0] if len(lines) == 1 else f"{lines[0]} ...") from None


def zoo_models(config: RunConfig) -> list[tuple[str, str | None]]:
    """(zoo name, the domain it serves in a run over several) of every zoo model the run loads:
    the student, and each domain's teacher unless the method's teacher is the student itself."""
    from distill import registry

    parts = registry.domain_parts(config.domain.name)
    models: list[tuple[str, str | None]] = [(config.student.name, None)]
    if not registry.method_entry(config.method.name).own_teacher:
        models += [(config.teacher_of(p).name, p if len(parts) > 1 else None) for p in parts]
    return list(dict.fromkeys((n, p) for n, p in models if n.startswith(PREFIX)))
