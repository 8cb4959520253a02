"""Weights & Biases for Trunk: whether it can be reached, and pretrained-trunk directories as W&B artifacts.

A trunk directory is logged as an artifact of type ``trunk`` (aliases ``latest``, and ``best`` when
it holds the best checkpoint's weights) at the end of pretraining and by ``trunk export
--wandb-project``. ``model.init_from`` takes ``wandb-artifact://entity/project/name:alias`` as well
as a directory: the artifact is downloaded once (under ``$TRUNK_CACHE/artifacts``) where W&B is
reachable, and refused with the way out where it is not.
"""

from __future__ import annotations

import json
import netrc
import os
import re
import socket
from pathlib import Path
from urllib.parse import urlparse

ARTIFACT_PREFIX = "wandb-artifact://"
OFFLINE_MODES = ("offline", "disabled", "dryrun")


def wandb_reachable(timeout: float = 3.0) -> bool:
    """Whether the W&B server answers within ``timeout`` seconds (wandb itself would retry for minutes)."""
    url = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai")
    try:
        socket.create_connection(
            (url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout=timeout
        ).close()
        return True
    except OSError:
        return False


def wandb_has_credentials() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError):
        return False


def artifact_name(text: str) -> str:
    """A valid W&B artifact name from any text (letters, digits, ``-``, ``_`` and ``.``)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-.") or "trunk"


def log_trunk_artifact(run, path: str | Path, name: str, aliases: list[str]) -> None:
    """Log the trunk directory ``path`` to the W&B ``run`` as a new version of the artifact ``name``."""
    import wandb

    path = Path(path)
    config = json.loads((path / "config.json").read_text())
    artifact = wandb.Artifact(
        artifact_name(name),
        type="trunk",
        metadata={k: config[k] for k in ("trunk", "stems", "heads") if k in config},
        description="A Trunk pretrained-trunk directory: start a run from it with model.init_from.",
    )
    artifact.add_dir(str(path))
    run.log_artifact(artifact, aliases=aliases)


def resolve_init_from(reference: str | Path) -> Path:
    """``model.init_from`` as a local path: a W&B artifact or Hugging Face Hub reference is downloaded (once), anything
    else is a path."""
    reference = str(reference)
    from trunk.formats.hf import download, transformer_folder
    from trunk.formats.hub import HUB_PREFIX

    if reference.startswith(HUB_PREFIX):
        return download(reference)
    if not reference.startswith(ARTIFACT_PREFIX):  # ~/models/x, as the data's paths are read
        return transformer_folder(Path(reference).expanduser())
    name = reference[len(ARTIFACT_PREFIX) :]
    if name.count("/") != 2 or ":" not in name.rsplit("/", 1)[1]:
        raise ValueError(
            f"model.init_from={reference!r}: a W&B artifact reference is "
            f"{ARTIFACT_PREFIX}<entity>/<project>/<name>:<alias or version>, e.g. "
            "wandb-artifact://my-team/trunk/trunk-pretrain:latest."
        )
    offline = os.environ.get("WANDB_MODE") in OFFLINE_MODES or not wandb_has_credentials() or not wandb_reachable()
    if offline:
        raise ValueError(
            f"model.init_from={reference!r} is a W&B artifact, but W&B is offline here (WANDB_MODE, no API key, or no "
            f"route to the server). Download it where W&B is reachable (`wandb artifact get {name} --root DIR`) and "
            "pass that directory as model.init_from."
        )
    import wandb

    from trunk.core.codec import cache_dir

    try:
        artifact = wandb.Api(timeout=30).artifact(name, type="trunk")
    except (wandb.errors.CommError, ValueError) as err:
        raise ValueError(
            f"model.init_from={reference!r}: W&B has no such trunk artifact ({err}). Check the entity, project, name "
            "and alias on the project's Artifacts page."
        ) from None
    return Path(artifact.download(root=str(cache_dir() / "artifacts" / artifact_name(name))))
