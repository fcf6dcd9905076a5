"""Domains: each folder exposes one builder `build(config) -> Domain` and its config model.

Resolved lazily by name through `distill/registry.py`; the name is the folder, the CLI word and
the MLflow tag.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from distill import registry

if TYPE_CHECKING:
    from distill.config import DomainBase
    from distill.domains.base import Domain


def build_domain(config: DomainBase) -> Domain:
    domain: Domain = registry.resolve(registry.domain_entry(config.name).build)(config)
    return domain
