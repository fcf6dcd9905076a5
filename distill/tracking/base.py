"""The `Tracker` interface: what a run reports, independent of the backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol


class Tracker(Protocol):
    """One tracked run. Metrics are buffered; `flush` and `finish` write them out."""

    run_id: str

    def log_params(self, params: dict[str, Any]) -> None: ...

    def set_tags(self, tags: dict[str, str]) -> None: ...

    def log_metrics(self, metrics: dict[str, float], step: int) -> None: ...

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None: ...

    def flush(self) -> None: ...

    def sync(self, timeout_s: float) -> bool:
        """Send what is queued within `timeout_s` if the store answers; True when level."""
        ...

    def finish(self, status: str = "FINISHED", error: str | None = None) -> None: ...


class NullTracker:
    """Tracking switched off (tests of pieces that need no store)."""

    run_id = "none"

    def log_params(self, params: dict[str, Any]) -> None:
        pass

    def set_tags(self, tags: dict[str, str]) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        pass

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        pass

    def flush(self) -> None:
        pass

    def sync(self, timeout_s: float) -> bool:
        return True

    def finish(self, status: str = "FINISHED", error: str | None = None) -> None:
        pass
