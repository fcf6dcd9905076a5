"""How each side of a run sees an item: the student's rollout prompt, and the teacher's prompt as
its method renders it (the plain problem, or the problem with a privileged solution: OPSD).

One place for both, so preflight, the budget checks and the trainers build the same ids.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from distill import registry
from distill.config import OPSDMethod

if TYPE_CHECKING:
    from distill.config import RunConfig
    from distill.domains.base import Domain, Item
    from distill.engines.base import Engine

# How a teacher engine sees an item: the ids of its prompt.
PromptFor = Callable[["Engine", "Item"], list[int]]


def plain_prompt(engine: Engine, item: Item) -> list[int]:
    """The problem as the student sees it, in `engine`'s own chat template."""
    return list(engine.prompt_ids(item.prompt))


def teacher_message(method: OPSDMethod, domain: Domain, item: Item, problem: str | None = None) -> str:
    """OPSD's teacher's user message: `method.teacher_template` around the student's problem
    (`problem`, default the item's prompt; an episode's first user message) and the privileged
    context (the config has checked the template's placeholders)."""
    return domain.privileged_message(method.teacher_template, item, problem)


def privileged_prompt(method: OPSDMethod, domain: Domain) -> PromptFor:
    """The teacher's prompt with the domain's privileged context (OPSD)."""

    def prompt_for(engine: Engine, item: Item) -> list[int]:
        return list(engine.prompt_ids(teacher_message(method, domain, item)))

    return prompt_for


def trainer_prompt_ids(engine: Engine, prompt: str) -> list[int]:
    """The prompt ids an on-policy trainer rolls out from (a conversational prompt, rendered and
    tokenised in one call as TRL does it)."""
    kwargs: dict[str, Any] = (
        {} if engine.enable_thinking is None else {"enable_thinking": engine.enable_thinking}
    )
    tokenizer: Any = engine.tokenizer
    out = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
        **kwargs,
    )
    return list(out["input_ids"])


@dataclass(frozen=True)
class TeacherView:
    """How a run's teacher sees an item, and whether it must render the student's prompt token
    for token (it scores the student's ids after its own prompt)."""

    prompt_for: PromptFor
    same_template: bool


def teacher_view(config: RunConfig, domain: Domain) -> TeacherView | None:
    """The run's method's view (registry.py `MethodEntry.view`); None for a method whose teacher
    never reads the student's prompt (it writes its own responses)."""
    entry = registry.method_entry(config.method.name)
    if entry.view is None:
        return None
    # A continuing teacher (ROSE) may render its own template: cross-family pairs do by design.
    same = entry.teacher == "scores"
    if entry.view == "privileged":
        assert isinstance(config.method, OPSDMethod), "the privileged view is OPSD's"
        return TeacherView(privileged_prompt(config.method, domain), same)
    return TeacherView(plain_prompt, same)
