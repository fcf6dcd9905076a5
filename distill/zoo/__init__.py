"""The embedded default: tiny tokenizers and models built on this machine, cached by recipe.

`zoo:<name>` wherever a model is expected names a zoo entry built for the run's domain; anything
else is a local path or a Hugging Face id.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from distill.config import DomainBase
    from distill.settings import Settings

PREFIX = "zoo:"


def resolve_model(name: str, domain: DomainBase, settings: Settings, show_progress: bool = True) -> str:
    """A loadable path or hub id for `name`, building zoo entries on first use."""
    if not name.startswith(PREFIX):
        return name
    from distill.zoo.build import ensure_built

    return str(ensure_built(settings.zoo_path, name[len(PREFIX) :], domain, show_progress))
