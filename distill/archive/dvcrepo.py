"""Which DVC repository and remote a run is archived with.

The user's git+DVC repository is used when the workspace lies inside one and git would track the
`.dvc` files there; otherwise the workspace gets a DVC repository of its own (`no_scm`: no git
needed). DVC is imported inside functions: it costs about a second and `distill --help` must stay
instant.

Remotes: `DISTILL_REMOTE` (any DVC remote URL) is configured as the remote `distill`; without it
the repository's own default remote is used, else a local folder `<workspace>/dvc-remote`.
Credentials are never written by distill: DVC reads them from the environment (AWS_*, GOOGLE_*,
SSH agent) or from DVC's local config (`.dvc/config.local`, not committed). Every URL that
leaves this module for a manifest, MLflow or the terminal goes through `redact_url`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

if TYPE_CHECKING:
    from dvc.repo import Repo

    from distill.settings import Settings

REMOTE_NAME = "distill"
# Hardlinks keep a 500 MB checkpoint from being copied into the cache; on ext4 DVC's default
# "reflink,copy" copies. Small files that the runner may rewrite are unprotected (copied) after.
OWN_CACHE_TYPE = "hardlink,copy"


class ArchiveError(ValueError):
    """A one-line, user-facing archive error (CLI exit code 2)."""


def redact_url(url: str) -> str:
    """The URL without a password or query string (where signed URLs and tokens live)."""
    parts = urlsplit(url)
    if not parts.scheme or len(parts.scheme) == 1:  # a local path (or a Windows drive letter)
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    if parts.username:
        host = f"{parts.username}@{host}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


@dataclass
class ArchiveRepo:
    repo: Repo
    root: Path
    # True: the workspace's own DVC repository; False: the user's git+DVC repository.
    own: bool
    remote: str
    # Redacted: safe to print and record.
    remote_url: str

    def close(self) -> None:
        self.repo.close()


def _quiet_dvc() -> None:
    # DVC's INFO lines ("To track the changes with git, run: ...") are not the user's to act on here.
    logging.getLogger("dvc").setLevel(logging.WARNING)


def _user_repo(workspace: Path) -> Repo | None:
    """The git+DVC repository the workspace lies in, when git would track `.dvc` files there."""
    from dvc.exceptions import NotDvcRepoError
    from dvc.repo import Repo

    if (workspace / ".dvc").is_dir():
        return None  # the workspace's own repository
    try:
        repo = Repo(str(workspace), uninitialized=False)
    except NotDvcRepoError:
        return None
    from dvc.scm import NoSCM

    probe = workspace / "runs" / "probe.dvc"
    if isinstance(repo.scm, NoSCM) or repo.scm.is_ignored(str(probe)):
        # Git ignores the workspace (the usual `/workspace/` line): .dvc files there could not be
        # committed, so the workspace keeps its own repository instead.
        repo.close()
        return None
    return repo


def _own_repo(workspace: Path) -> Repo:
    from dvc.repo import Repo

    if not (workspace / ".dvc").is_dir():
        workspace.mkdir(parents=True, exist_ok=True)
        Repo.init(str(workspace), no_scm=True).close()
        repo = Repo(str(workspace))
        with repo.config.edit("repo") as conf:
            conf["cache"]["type"] = OWN_CACHE_TYPE
            conf["core"]["analytics"] = False
            conf["core"]["check_update"] = False
        repo.close()
    return Repo(str(workspace))


def _configure_remote(repo: Repo, own: bool, settings: Settings) -> tuple[str, str]:
    """(remote name, URL) to push to, configuring `distill` when distill chooses the remote."""
    remotes: dict[str, Any] = dict(repo.config["remote"])
    default = repo.config["core"].get("remote")
    if settings.remote is None and default:
        if default not in remotes:
            raise ArchiveError(
                f"DVC core.remote names {default!r}, which is not configured in {repo.root_dir}"
            )
        return str(default), str(remotes[default]["url"])
    if settings.remote is not None:
        url = settings.remote
        if "://" in url and urlsplit(url).password:
            # It would land in .dvc/config and in DVC's error messages.
            raise ArchiveError(
                f"DISTILL_REMOTE {redact_url(url)} carries a password; give credentials through the "
                "environment or DVC's local config (dvc remote modify --local distill password ...)"
            )
        if "://" not in url:
            url = str(Path(url).expanduser().resolve())
    else:
        url = str((settings.workspace / "dvc-remote").resolve())
    if remotes.get(REMOTE_NAME, {}).get("url") != url:
        # In the user's repository the choice goes to the uncommitted local config.
        with repo.config.edit("repo" if own else "local") as conf:
            conf["remote"][REMOTE_NAME] = {"url": url}
            if own or not default:
                conf["core"]["remote"] = REMOTE_NAME
    return REMOTE_NAME, url


def open_archive(settings: Settings) -> ArchiveRepo:
    """The DVC repository and remote for runs under `settings.workspace`."""
    try:
        from dvc.repo import Repo
    except ImportError:
        raise ArchiveError("distill archive needs DVC: pip install 'distill[archive]'") from None
    _quiet_dvc()

    workspace = settings.workspace.resolve()
    repo = _user_repo(workspace)
    own = repo is None
    if repo is None:
        repo = _own_repo(workspace)
    name, url = _configure_remote(repo, own, settings)
    repo.close()
    repo = Repo(str(repo.root_dir))  # re-read the configuration just written
    return ArchiveRepo(repo=repo, root=Path(repo.root_dir), own=own, remote=name, remote_url=redact_url(url))
