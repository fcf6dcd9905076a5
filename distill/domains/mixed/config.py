"""The `domain:` section of a run over several domains (`rlve+dapo`): each part's own section and
the mix its training prompts are drawn in."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, SerializeAsAny, ValidationError, field_validator, model_validator

from distill import registry
from distill.config import DomainBase, domain_model


class MixConfig(DomainBase):
    """Several single-turn domains in one run: every training prompt comes from one of them (by
    `mix`), is scored by that domain's verifier and by its teacher (`teachers.<domain>`), and each
    is evaluated on its own items. `train_size` is the mix's total; each part keeps its own
    `eval_size` and `eval_seed`."""

    # How items are drawn, not which items each part has: the parts' cached items stay theirs.
    runtime_fields: ClassVar[tuple[str, ...]] = ("alternate", "lr", "optimizer_state")

    name: str
    parts: dict[str, SerializeAsAny[DomainBase]] = Field(default_factory=dict)
    # Relative weights of the parts' prompts in the training stream; missing: equal.
    mix: dict[str, float] = Field(default_factory=dict)
    # Each step trains one domain, the domains' steps in proportion to `mix` and spread evenly over
    # the run, instead of every step holding each domain's share: what lets each learn at its own lr.
    alternate: bool = False
    # A domain's learning rate with `alternate`: its steps train at this lr, shaped by
    # optim.scheduler as every step is; a domain left out trains at optim.lr.
    lr: dict[str, float] = Field(default_factory=dict)
    # per_domain with `alternate`: each domain's steps keep Adam moments of their own (the weights
    # are shared), so each follows its own gradients as in a run of its own (methods/alternate.py);
    # one optimizer state a domain.
    optimizer_state: Literal["shared", "per_domain"] = "shared"

    @model_validator(mode="before")
    @classmethod
    def _default_parts(cls, data: Any) -> Any:
        # `--domain rlve,dapo` alone: every part at its own defaults.
        if isinstance(data, dict) and isinstance(data.get("name"), str):
            given = data.get("parts") or {}
            if isinstance(given, dict):
                names = registry.domain_parts(data["name"])
                data = {**data, "parts": {n: given.get(n, {}) for n in names} | given}
        return data

    @field_validator("parts", mode="before")
    @classmethod
    def _part_models(cls, value: Any) -> Any:
        # Each part is its own domain's model, so its fields are checked as in a one-domain run.
        if not isinstance(value, dict):
            return value
        return {name: _part(name, part) for name, part in value.items()}

    @model_validator(mode="after")
    def _parts_match_name(self) -> MixConfig:
        registry.domain_entry(self.name)  # known single-turn domains, each once
        names = registry.domain_parts(self.name)
        if len(names) < 2:
            raise ValueError(f"a mixed domain names two or more domains joined by {registry.MIX!r}")
        missing = [n for n in names if n not in self.parts]
        if missing or list(self.parts) != names:
            have = ", ".join(self.parts) or "none"
            raise ValueError(f"parts must be {', '.join(names)} in that order (got {have})")
        unknown = [k for k in self.mix if k not in self.parts]
        if unknown:
            raise ValueError(f"mix.{unknown[0]}: {unknown[0]} is not a part of {self.name}")
        for field in ("eval_size", "eval_seed"):
            if getattr(self, field) != DomainBase.model_fields[field].default:
                raise ValueError(f"{field} is each part's own: set domain.parts.<domain>.{field}")
        bad = [k for k, w in self.mix.items() if not w > 0]
        if bad:
            raise ValueError(f"mix.{bad[0]}: a weight must be > 0 (leave a domain out of the run instead)")
        self._check_rates()
        return self

    def _check_rates(self) -> None:
        unknown = [k for k in self.lr if k not in self.parts]
        if unknown:
            raise ValueError(f"lr.{unknown[0]}: {unknown[0]} is not a part of {self.name}")
        bad = [k for k, lr in self.lr.items() if not lr > 0]
        if bad:
            raise ValueError(f"lr.{bad[0]}: a learning rate must be > 0")
        if self.optimizer_state == "per_domain" and not self.alternate:
            raise ValueError(
                "optimizer_state: a step trains every domain at once; set domain.alternate=true for per_domain"
            )
        if self.lr and not self.alternate:
            raise ValueError(
                "lr: a step trains every domain at once; set domain.alternate=true for a domain's own lr"
            )

    def weights(self) -> dict[str, float]:
        """Each part's share of the training prompts (summing to 1)."""
        raw = {name: self.mix.get(name, 1.0) for name in self.parts}
        total = sum(raw.values())
        return {name: w / total for name, w in raw.items()}

    def rates(self, lr: float) -> dict[str, float]:
        """Each part's learning rate: its own `lr`, else the run's `lr`."""
        return {name: self.lr.get(name, lr) for name in self.parts}


def _part(name: str, fields: Any) -> DomainBase:
    """One part's config, validated by its own domain's model; an error names `parts.<name>.`."""
    if isinstance(fields, DomainBase):
        return fields
    try:
        registry.domain_entry(name)
        return domain_model(name).model_validate({**(fields or {}), "name": name})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"parts.{name}.{where}: {str(first['msg']).removeprefix('Value error, ')}") from None
