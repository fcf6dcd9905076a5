"""Presets, config files and dotted overrides -> one validated `RunConfig`; run configs on disk.

Schema defaults <- `configs/<domain>/<method>.yaml` <- `--config` file <- `section.key=value`
overrides, validated once; every error is one line naming the field or the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from distill import registry
from distill.config.models import ConfigError, EvalConfig, RunConfig, domain_config, format_validation_error


def presets_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "configs"


def preset_path(domain: str, method: str) -> Path:
    return presets_dir() / domain / f"{method}.yaml"


def read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config file {path} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})"
        ) from None
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
    # `--domain rlve,dapo` names a run over both: the domain word joins them (`rlve+dapo`).
    domain = registry.MIX.join(part.strip() for part in str(domain).split(","))
    try:
        registry.domain_entry(domain)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if method not in registry.METHODS:
        raise ConfigError(f"unknown method {method!r}; known: {', '.join(registry.METHODS)}")
    data = _preset(domain, method)
    data = deep_merge(data, file_data)
    data = deep_merge(data, {"domain": {"name": domain}, "method": {"name": method}})
    for path, value in parsed:
        set_dotted(data, path, value)
    for spec in (data.get("teachers") or {}).values():
        if isinstance(spec, dict) and "name" not in spec:
            spec["name"] = "zoo:teacher"
    for role in ("student", "teacher"):
        # `teacher.engine=server teacher.url=...` alone keeps the schema's default model, as any
        # other partial override does (opsd's teacher is the student: RunConfig fills it).
        spec = data.get(role)
        own_teacher = role == "teacher" and registry.METHODS[method].own_teacher
        if isinstance(spec, dict) and "name" not in spec and not own_teacher:
            spec["name"] = f"zoo:{role}"
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from None


def _preset(domain: str, method: str) -> dict[str, Any]:
    """`configs/<domain>/<method>.yaml`; for a mix without a preset of its own (`dapo+rlve`), the
    first part's preset with every part's own `domain:` section."""
    preset = preset_path(domain, method)
    if preset.exists():
        return read_yaml(preset)
    parts = registry.domain_parts(domain)
    if len(parts) == 1:
        return {}
    presets = {part: read_yaml(p) if (p := preset_path(part, method)).exists() else {} for part in parts}
    data = {k: v for k, v in presets[parts[0]].items() if k != "domain"}
    data["domain"] = {"parts": {part: presets[part].get("domain", {}) for part in parts}}
    return data


# What `distill eval` reads of a config: the domain's items and the sampling of the eval.
EVAL_SECTIONS = ("domain", "eval")
# Eval fields that shape a training run's evals only; a standalone eval has no steps or teacher.
_RUN_ONLY_EVAL = ("every_steps", "eval_teacher")
# Domain fields `distill eval` sets from its own options (a benchmark names its metrics).
_EVAL_OPTION_FIELDS = {"eval_benchmark": "--benchmark", "eval_data": "--data", "name": "--domain"}


def resolve_eval_config(
    domain: str | None = None, config_file: Path | None = None, overrides: list[str] | None = None
) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """`distill eval`'s settings: the `domain:` and `eval:` sections of a config file (e.g. a run's
    config.yaml) <- `domain.*` / `eval.*` dotted overrides, validated as a run's are.

    Returns (domain name, domain fields, eval fields): only the fields that were set, so the
    eval's own defaults (a benchmark protocol's sampling) still apply to the rest.
    """
    file_data = read_yaml(config_file) if config_file is not None else {}
    data: dict[str, Any] = {}
    for section in EVAL_SECTIONS:
        value = file_data.get(section) or {}
        if not isinstance(value, dict):
            raise ConfigError(f"config file {config_file}: {section} must be a mapping")
        data[section] = dict(value)
    for key in _RUN_ONLY_EVAL:  # a run's saved config carries them; they mean nothing here
        data["eval"].pop(key, None)
    for text in overrides or []:
        path, value = parse_override(text)
        dotted = ".".join(path)
        if path[0] not in EVAL_SECTIONS or len(path) < 2:
            raise ConfigError(f"override {dotted}: distill eval takes domain.* and eval.* overrides")
        if path[0] == "eval" and path[1] in _RUN_ONLY_EVAL:
            raise ConfigError(f"override {dotted}: applies to a training run's evals, not to distill eval")
        if path[0] == "domain" and path[1] in _EVAL_OPTION_FIELDS:
            raise ConfigError(f"override {dotted}: use {_EVAL_OPTION_FIELDS[path[1]]} instead")
        set_dotted(data, path, value)
    name = domain or _dig(data, "domain", "name") or "rlve"
    if name not in registry.DOMAINS:
        raise ConfigError(f"unknown domain {name!r}; known: {', '.join(registry.DOMAINS)}")
    fields = {k: v for k, v in data["domain"].items() if k != "name"}
    domain_config(name, **fields)  # one line naming a bad domain field, before anything loads
    try:
        checked = EvalConfig.model_validate(data["eval"])
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, prefix="eval")) from None
    return name, fields, {key: getattr(checked, key) for key in data["eval"]}


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
