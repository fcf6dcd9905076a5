"""Environment settings (`DISTILL_*`): where things live, not how a run behaves."""

from __future__ import annotations

from pathlib import Path

from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DISTILL_", extra="ignore")

    # Runs, the zoo cache and the embedded MLflow store live here.
    workspace: Path = Path("workspace")
    # None: an embedded sqlite store at <workspace>/mlflow.db (no server needed).
    tracking_uri: str | None = None
    # None: <workspace>/zoo
    zoo_dir: Path | None = None
    # DVC remote for `distill archive`; None: <workspace>/dvc-remote
    remote: str | None = None

    @property
    def runs_dir(self) -> Path:
        return self.workspace / "runs"

    @property
    def zoo_path(self) -> Path:
        return self.zoo_dir if self.zoo_dir is not None else self.workspace / "zoo"

    @property
    def resolved_tracking_uri(self) -> str:
        if self.tracking_uri:
            return self.tracking_uri
        return f"sqlite:///{(self.workspace / 'mlflow.db').resolve()}"

    @property
    def artifact_root(self) -> Path:
        return (self.workspace / "mlartifacts").resolve()


def get_settings() -> Settings:
    return Settings()
