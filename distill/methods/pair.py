"""What a student-teacher pair's tokenizers alone decide, before a run directory exists: whether
the teacher reads the student's ids or crosses to its own, a loss that needs one vocabulary on a
cross-family pair, a bridge that loses text on the domain's own prompts and solutions."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from distill import registry
from distill.config import ConfigError, OPDMethod
from distill.methods.cross_family import refusal
from distill.tokenizer_bridge.bridge import same_tokenizer
from distill.tokenizer_bridge.seam import check_pair

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from distill.config import RunConfig
    from distill.domains.base import Domain


def bridge_problem(
    student: PreTrainedTokenizerBase, teacher: PreTrainedTokenizerBase, domain: Domain, names: tuple[str, str]
) -> str | None:
    """Why the bridge between the two tokenizers cannot carry the domain's own texts (its first
    items' prompts and solutions, cut at several seams); None when it round-trips them."""
    texts = [t for item in domain.train_items()[:8] for t in (item.prompt, item.solution or "") if t]
    report = check_pair(student, teacher, texts, cuts=8)
    if report.ok:
        return None
    bad = next(row for row in report.rows if not row.ok)
    s, t = names
    return (
        f"the tokenizer bridge {s} -> {t} is lossy ({bad.name}: {bad.failures[0]}); "
        f"see `distill bridge check --student {s} --teacher {t}`"
    )


def check_tokenizers(
    config: RunConfig,
    student: PreTrainedTokenizerBase,
    teachers: Mapping[str, PreTrainedTokenizerBase],
    domain: Domain,
) -> None:
    """ConfigError (one line) for a pair the method cannot run: a cross-family pair on a loss of
    one shared vocabulary (OPD's jsd), or a cross-family continuing teacher (ROSE) whose bridge is
    lossy on the domain's texts. Same-family pairs and writing teachers pass."""
    entry = registry.method_entry(config.method.name)
    method = config.method
    forced = isinstance(method, OPDMethod) and method.cross_family == "always"
    for part, teacher in teachers.items():
        if same_tokenizer(student, teacher) and not forced:
            continue
        names = (config.student.name, config.teacher_of(part).name)
        if entry.cross_family_scoring and isinstance(method, OPDMethod):
            reason = refusal(method, *names)
            if reason:
                raise ConfigError(reason)
        if entry.teacher == "continues":
            problem = bridge_problem(student, teacher, domain, names)
            if problem:
                raise ConfigError(f"{method.name}: {problem}")
