"""What a diagnose rule returns: a finding with its severity, the numbers behind it, and the fix."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from enum import IntEnum
from typing import Any

# The exit code of a diagnosis a rule could not finish: above every severity, because the rule that
# crashed might have found an error; the findings the other rules made still stand.
INCOMPLETE = 3
# The name of the finding a crashed rule leaves (`rule_crashed:<rule>`).
CRASHED = "rule_crashed"


class Severity(IntEnum):
    # The value is the CLI exit code a finding of this severity maps to (CI gates on it).
    INFO = 0
    WARNING = 1
    ERROR = 2

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclass(frozen=True)
class Evidence:
    """One number behind a finding: the metric (or file) it comes from and the steps it covers."""

    source: str
    value: float | str
    steps: str = ""
    note: str = ""

    def text(self) -> str:
        value = fmt(self.value) if isinstance(self.value, float | int) else self.value
        where = f" ({self.steps})" if self.steps else ""
        note = f" — {self.note}" if self.note else ""
        return f"{self.source} = {value}{where}{note}"


@dataclass(frozen=True)
class Fix:
    """A config change, written as the `key=value` override `distill run` accepts."""

    key: str
    value: str
    reason: str = ""

    @property
    def override(self) -> str:
        return f"{self.key}={self.value}"


@dataclass
class Finding:
    name: str
    severity: Severity
    title: str
    evidence: list[Evidence]
    why: str
    fixes: list[Fix] = field(default_factory=list)
    # Fixes that are not a config key (read a file, check data); said in words.
    advice: str = ""

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["severity"] = self.severity.label
        out["evidence"] = [{**asdict(e), "text": e.text()} for e in self.evidence]
        out["fixes"] = [{**asdict(f), "override": f.override} for f in self.fixes]
        return out


def rank(findings: list[Finding]) -> list[Finding]:
    """Most severe first; the rule order breaks ties (rules are listed by how often they bite)."""
    return sorted(findings, key=lambda f: -int(f.severity))


def crashed(findings: list[Finding]) -> list[str]:
    """The rules that crashed instead of judging the run (their findings are `rule_crashed:<rule>`)."""
    return [f.name.partition(":")[2] for f in findings if f.name.partition(":")[0] == CRASHED]


def exit_code(findings: list[Finding]) -> int:
    """0 nothing above info, 1 warnings, 2 errors; INCOMPLETE (3) when a rule crashed."""
    if crashed(findings):
        return INCOMPLETE
    return max((int(f.severity) for f in findings), default=0)


def fmt(x: float | int | str) -> str:
    """Numbers the way a reader compares them: 3 significant digits, scientific when tiny or huge."""
    if isinstance(x, str):
        return x
    if isinstance(x, bool):
        return str(x).lower()
    if isinstance(x, int):
        return str(x)
    if math.isnan(x):
        return "nan"
    if x == 0:
        return "0"
    if float(x).is_integer() and abs(x) < 1e6:
        return str(int(x))
    if abs(x) < 1e-3 or abs(x) >= 1e6:
        return f"{x:.2e}"
    if abs(x) >= 1e3:
        return f"{x:.0f}"  # token counts: 17300, not 1.73e+04
    return f"{x:.3g}"


def pct(x: float) -> str:
    return f"{x:.1%}" if math.isfinite(x) else "nan"


def nice_tokens(n: float) -> int:
    """A token budget at least `n`: the next power of two (budgets are set in powers of two)."""
    n = max(1.0, float(n))
    return 1 << math.ceil(math.log2(n))


def nearest_pow2(n: float) -> int:
    n = max(1.0, float(n))
    return 1 << round(math.log2(n))
