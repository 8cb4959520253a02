"""Trunk directories on the Hugging Face Hub: a model card written with every export, an upload
(``trunk export CKPT DIR --push-to-hub ORG/NAME``), and ``model.init_from: hf://ORG/NAME[@revision]``, downloaded
once into the Hub's cache and used like a local directory (its checksums verified as for any trunk directory)."""

from __future__ import annotations

import json
import os
from pathlib import Path

HUB_PREFIX = "hf://"
CARD_FILE = "README.md"
TRUNK_FILES = ["config.json", "model.safetensors", "*tokenizer*.json", CARD_FILE, "onnx/*"]


def parse_reference(reference: str) -> tuple[str, str | None]:
    """``hf://ORG/NAME[@revision]`` -> (repository id, revision)."""
    repo, _, revision = reference[len(HUB_PREFIX) :].partition("@")
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise ValueError(f"model.init_from={reference!r}: a Hub reference is {HUB_PREFIX}<org>/<name>[@<revision>], "
                         "e.g. hf://my-org/trunk-base or hf://my-org/trunk-base@v1.")
    return repo, revision or None


def download(reference: str, patterns: list[str] = TRUNK_FILES) -> Path:
    """The local folder of a Hub trunk: the cached copy, else a download of its files (those matching ``patterns``)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    repo, revision = parse_reference(reference)
    how = (
        f"Download it where the Hub is reachable (`hf download {repo}{f' --revision {revision}' if revision else ''} "
        "--local-dir DIR`) and pass that directory as model.init_from."
    )
    try:
        return Path(snapshot_download(repo, revision=revision, allow_patterns=patterns))
    except (RepositoryNotFoundError, RevisionNotFoundError) as err:
        raise ValueError(
            f"model.init_from={reference!r}: the Hub has no such repository or revision ({type(err).__name__}). Check "
            "the name, the revision, and your access (`hf auth login` for a private one)."
        ) from None
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError) as err:
        offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
        reason = (
            "HF_HUB_OFFLINE is set and it is not in the local cache"
            if offline
            else f"the Hub is not reachable ({type(err).__name__})"
        )
        raise ValueError(f"model.init_from={reference!r}: {reason}. {how}") from None


def write_model_card(
    directory: str | Path, metrics: dict | None = None, repo_id: str | None = None, data: dict | None = None,
    origin: str | None = None,
) -> Path:
    """``directory/README.md``: what the trunk is (architecture), its tasks and labels, the data each task was
    trained on (``data``: task -> its data spec, as the run's config named it), the metrics at export, and how to
    load it. ``origin``: the model pretrained elsewhere it was imported from (``trunk import``)."""
    directory = Path(directory)
    meta = json.loads((directory / "config.json").read_text())
    trunk, heads = meta["trunk"], meta.get("heads") or {}
    source = f"{HUB_PREFIX}{repo_id}" if repo_id else str(directory)
    lines = ["---", "library_name: trunk", "tags: [trunk, transformer, pytorch-lightning]", "---", "",
             f"# {repo_id or directory.name}", "",
             "A Trunk model: one transformer trunk written from scratch in PyTorch, with a head per task.", "",
             *([f"Imported from `{origin}` (`trunk import`): its weights and tokenizer, mapped into Trunk's own "
                "modules. Its licence is the original model's.", ""] if origin else []),
             "## Architecture", "", "| field | value |", "|---|---|"]
    lines += [f"| `{k}` | {v} |" for k, v in trunk.items()]
    lines += ["", f"Stems: {', '.join(meta.get('stems') or {}) or 'text'}.", ""]
    if heads:
        lines += ["## Tasks", "", "| task | kind | labels | trained on |", "|---|---|---|---|"]
        for task, head in heads.items():
            labels = ", ".join(map(str, head.get("label_names") or [])) or "-"
            lines.append(
                f"| `{task}` | {head.get('kind', '-')} | {labels} | "
                f"{training_data((data or {}).get(task) or head.get('data'))} |"
            )
        lines.append("")
    else:
        lines += ["This directory holds the trunk only (no task heads): fine-tune it for a task.", ""]
    if metrics:
        lines += ["## Metrics at export", "", "| metric | value |", "|---|---|"]
        lines += [f"| `{k}` | {v:.4f} |" if isinstance(v, float) else f"| `{k}` | {v} |" for k, v in metrics.items()]
        lines.append("")
    lines += ["## Use", "", "Fine-tune it (`pip install trunk`):", "", "```bash",
              f"trunk fit --config my_task.yaml --model.init_from={source}", "```", ""]
    if heads:
        lines += ["Predict with its heads:", "", "```python", "from trunk.tasks import load", "",
                  f"model = load({source!r})", f"model.predict([...], task={next(iter(heads))!r})", "```", ""]
    path = directory / CARD_FILE
    path.write_text("\n".join(lines))
    return path


def training_data(spec: dict | None) -> str:
    """The data a task trained on, as its config named it: a hub dataset, or the training files' names (their folders
    are the trainer's own)."""
    if not spec:
        return "-"
    args = spec.get("init_args") or {}
    train = args.get("train")
    if args.get("dataset"):
        return (
            f"`{args['dataset']}`"
            + (f" ({args['dataset_config']})" if args.get("dataset_config") else "")
            + (f", split `{train}`" if train else "")
        )
    files = [train] if isinstance(train, str) else list(train or [])
    return ", ".join(f"`{Path(f).name}`" for f in files) or spec["class_path"].rsplit(".", 1)[-1]


def push(directory: str | Path, repo_id: str, private: bool = False) -> str:
    """Upload a trunk directory to the Hub repository ``repo_id`` (created if missing); the commit's URL."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    if repo_id.count("/") != 1:
        raise ValueError(f"--push-to-hub {repo_id!r}: name the repository as ORG/NAME.")
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        raise ValueError(
            f"--push-to-hub {repo_id}: HF_HUB_OFFLINE is set. The directory {directory} is written; upload it where "
            f"the Hub is reachable: `hf upload {repo_id} {directory} .`"
        )
    api = HfApi()
    try:
        api.create_repo(repo_id, private=private, exist_ok=True)
        return str(
            api.upload_folder(
                repo_id=repo_id, folder_path=str(directory), commit_message="Upload a Trunk model"
            ).commit_url
        )
    except (HfHubHTTPError, OSError) as err:
        raise ValueError(
            f"--push-to-hub {repo_id}: the upload failed ({type(err).__name__}: {err}). The directory {directory} is "
            f"written; upload it later with `hf upload {repo_id} {directory} .` (log in first: `hf auth login`)."
        ) from None
