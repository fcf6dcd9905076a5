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


def resolve_model(
    name: str,
    domain: DomainBase,
    settings: Settings,
    show_progress: bool = True,
    part: str | None = None,
    build: bool = True,
) -> str:
    """A loadable path or hub id for `name`, building zoo entries on first use (`build=False`:
    FileNotFoundError for one not built yet). `part`: the model serves that domain of a mixed
    run (`zoo:teacher` -> its `teacher@<part>`, zoo/build.py)."""
    if not name.startswith(PREFIX):
        return name
    # The builder trains models (torch): imported where a zoo name is resolved, so the package
    # itself stays as light as the config checks that read PREFIX (`distill --help` included).
    from distill.zoo.build import PART, ensure_built, entry_dir

    entry = name[len(PREFIX) :]
    if part is not None and len(getattr(domain, "parts", {})) > 1 and PART not in entry:
        entry = f"{entry}{PART}{part}"
    if not build:
        target = entry_dir(settings.zoo_path, entry, domain)
        if not (target / "zoo.json").exists():
            raise FileNotFoundError(target)
        return str(target)
    return str(ensure_built(settings.zoo_path, entry, domain, show_progress))
