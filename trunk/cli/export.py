"""``trunk export CKPT DIR``: a checkpoint as a pretrained-trunk directory (ONNX graphs, the Hub and W&B on request), or
one task of it as a task directory. LightningCLI's subcommands are Trainer methods, so this one is plain argparse."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from trunk.core.locks import writing_output_dir
from trunk.formats.artifacts import log_trunk_artifact, wandb_has_credentials, wandb_reachable
from trunk.formats.merge import MERGE_METHODS, merge_trunks
from trunk.formats.trunk_dir import export_checkpoint


def export_main(args: list[str]) -> None:
    """``trunk export CKPT DIR [--with-head]``: LightningCLI's subcommands are Trainer methods, so this one is plain
    argparse."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="trunk export",
        description="Write a pretrained-trunk directory (config.json, model.safetensors, tokenizer.json) from a "
                    "checkpoint written by `trunk fit`: the trunk and every task's head; start a run from it with "
                    "--model.init_from=DIR.",
    )
    parser.add_argument("ckpt", nargs="+", help="a .ckpt written by `trunk fit` (with --merge: two or more, or trunk "
                        "directories with heads)")
    parser.add_argument(
        "dir", help="the directory to write: new, empty, or (with --overwrite) an existing trunk directory"
    )
    parser.add_argument(
        "--trunk-only", action="store_true", help="leave out the tasks' heads (stored by default, by task name)"
    )
    parser.add_argument(
        "--task",
        metavar="NAME",
        help="write only this task's head (and its model.peft delta) as a task directory, "
        "without the trunk: load it beside the trunk it was trained on",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace DIR (atomically) if it already holds a trunk")
    parser.add_argument(
        "--push-to-hub",
        metavar="ORG/NAME",
        help="also upload DIR (with its model card, README.md) to this Hugging "
        "Face Hub repository, created if missing (log in first: `hf auth login`)",
    )
    parser.add_argument("--private", action="store_true", help="with --push-to-hub: create the repository private")
    parser.add_argument(
        "--onnx",
        action="store_true",
        help="also write DIR/onnx/<task>.onnx for each classification, "
        "multi-label, regression and NER head (pip install 'trunk[onnx]')",
    )
    parser.add_argument(
        "--quantize",
        choices=["int8"],
        help="with --onnx: also write DIR/onnx/<task>.int8.onnx, quantized by ONNX Runtime (load(DIR, runtime='onnx', "
        "quantize='int8'), `trunk serve DIR --runtime onnx --quantize int8`)",
    )
    parser.add_argument(
        "--wandb-project",
        help="also log DIR as a W&B artifact (type trunk, alias latest) in this project; "
        "offline without an API key (`wandb sync` uploads it)",
    )
    parser.add_argument("--artifact-name", help="the artifact's name (default: trunk-<DIR's name>)")
    parser.add_argument(
        "--format", choices=("trunk", "hf"), default="trunk",
        help="hf: a Hugging Face model folder that transformers' AutoModel...from_pretrained loads (BERT-family "
        "trunks; with the head of --task NAME, or the model's only head transformers has a class for)",
    )
    parser.add_argument(
        "--merge", choices=MERGE_METHODS,
        help="combine models fine-tuned separately from --base into one model with all their heads, without training: "
        "task_arithmetic (the base plus --merge-scale times the sum of the models' changes; default scale 1/n, their "
        "average) or ties (each change trimmed to its --merge-density largest entries, signs elected, agreeing values "
        "averaged; default scale 1), or deltas (models trained as deltas, model.peft, on the frozen base: each task "
        "keeps its own delta, so each answers exactly as its separate model did)",
    )
    parser.add_argument("--base", help="with --merge: the pretrained model the merged models were fine-tuned from (a "
                        "trunk directory, a Hugging Face folder, hf://ORG/NAME)")
    parser.add_argument("--merge-scale", type=float, help="with --merge: the factor the merged change is added with")
    parser.add_argument("--merge-density", type=float, default=0.2,
                        help="with --merge ties: the share of each model's change kept (default 0.2)")
    options = parser.parse_args(args)
    merging = [flag for flag, given in (("--base", options.base), ("--merge-scale", options.merge_scale)) if given]
    if options.merge is None and (merging or len(options.ckpt) > 1):
        sys.exit(f"error: {', '.join(merging) or f'{len(options.ckpt)} checkpoints'}: export writes one model; "
                 "combine several fine-tuned from one base with --merge ties|task_arithmetic --base BASE.")
    if options.merge and (not options.base or len(options.ckpt) < 2 or options.task or options.format != "trunk"
                          or options.trunk_only):
        sys.exit("error: --merge writes one trunk directory from two or more models fine-tuned from --base: give "
                 "CKPT CKPT [...] DIR --base BASE (the pretrained model they started from), without --task, "
                 "--trunk-only or --format hf.")
    options.ckpt = options.ckpt if options.merge else options.ckpt[0]
    if options.quantize and not options.onnx:
        sys.exit("error: --quantize int8 writes int8 ONNX graphs, so it needs --onnx. A PyTorch model is quantized "
                 "when it is loaded: trunk predict / serve --quantize int8, or load(DIR, quantize='int8').")
    try:
        with writing_output_dir(Path(options.dir), "DIR"):  # one writer per output
            write_export(options)
    except (PermissionError, FileExistsError) as err:
        sys.exit(f"error: {err}")


def write_export(options) -> None:
    """Write what ``trunk export`` was asked for into ``options.dir``, which this process holds."""
    if options.format == "hf":
        return export_hf_main(options)
    if options.task:
        return export_task_main(options)
    try:
        if options.merge:
            path = export_merged(options)
        else:
            path = export_checkpoint(options.ckpt, options.dir, heads=not options.trunk_only,
                                     overwrite=options.overwrite, repo_id=options.push_to_hub)
    except (FileNotFoundError, FileExistsError, ValueError) as err:
        sys.exit(f"error: {err}")
    print(f"Wrote {path}; fine-tune from it with --model.init_from={path}")
    if options.onnx:
        from trunk.formats.onnx import export_onnx
        from trunk.inference.predictor import load

        try:
            graphs = export_onnx(load(path, precision="32-true").model, path, quantize=options.quantize)
        except (ImportError, ValueError) as err:
            sys.exit(f"error: {err}")
        print(
            f"Wrote {', '.join(str(g) for g in graphs.values())} (inputs input_ids, attention_mask; see "
            f"{path}/onnx/tasks.json)"
        )
    if options.push_to_hub:
        from trunk.formats.hub import push

        try:
            url = push(path, options.push_to_hub, private=options.private)
        except ValueError as err:
            sys.exit(f"error: {err}")
        print(f"Uploaded {path} to https://huggingface.co/{options.push_to_hub} ({url}); fine-tune from it with "
              f"--model.init_from=hf://{options.push_to_hub}")
    if options.wandb_project:
        import wandb

        if not wandb_has_credentials() or not wandb_reachable():
            os.environ.setdefault("WANDB_MODE", "offline")
        name = options.artifact_name or f"trunk-{Path(path).name}"
        with wandb.init(project=options.wandb_project, job_type="export", dir=os.environ.get("WANDB_DIR")) as run:
            log_trunk_artifact(run, path, name, ["latest"])
        print(f"Logged {path} as the W&B artifact {name}:latest ({os.environ.get('WANDB_MODE', 'online')})")


def export_merged(options) -> Path:
    """``trunk export A B DIR --merge METHOD --base BASE``: the models' heads on the base's trunk plus their merged
    changes (``trunk.formats.merge``)."""
    from trunk.formats.hub import write_model_card
    from trunk.formats.task_dir import read_trunk
    from trunk.formats.trunk_dir import save_pretrained

    models = [read_trunk(source) for source in options.ckpt]
    merged = merge_trunks(read_trunk(options.base), models, options.merge, options.merge_scale, options.merge_density)
    path = save_pretrained(options.dir, merged, options.overwrite)
    write_model_card(path, repo_id=options.push_to_hub)
    tasks = {task: str(model.path) for model in models for task in model.heads}
    print(f"Merged ({options.merge}) the tasks {tasks} onto the trunk of '{options.base}'.")
    return path


def export_hf_main(options) -> None:
    """``trunk export SRC DIR --format hf``: a checkpoint or trunk directory as a transformers model folder."""
    from trunk.formats.hf_export import export_hf
    from trunk.formats.task_dir import read_trunk

    others = [flag for flag, given in (("--trunk-only", options.trunk_only), ("--onnx", options.onnx),
                                       ("--push-to-hub", options.push_to_hub),
                                       ("--wandb-project", options.wandb_project)) if given]
    if others:
        sys.exit(f"error: --format hf writes a transformers folder; {', '.join(others)} applies to trunk directories.")
    try:
        path, architecture = export_hf(read_trunk(options.ckpt), options.dir, options.task, options.overwrite)
    except (FileNotFoundError, FileExistsError, ValueError) as err:
        sys.exit(f"error: {err}")
    auto = auto_class(architecture)
    print(f"Wrote {path} ({architecture}): transformers.{auto}.from_pretrained('{path}') loads it"
          f"{' with its head' if auto != 'AutoModel' else ''}, as does {architecture}.from_pretrained")


def auto_class(architecture: str) -> str:
    """The transformers Auto class that loads a model folder of ``architecture`` with its head
    (BertForTokenClassification -> AutoModelForTokenClassification; a bare encoder -> AutoModel)."""
    if architecture.endswith("MTModel"):  # MarianMTModel: a translator
        return "AutoModelForSeq2SeqLM"
    if "For" not in architecture:
        return "AutoModel"
    head = architecture[architecture.index("For"):]
    return "AutoModel" + {"ForConditionalGeneration": "ForSeq2SeqLM"}.get(head, head)


def export_task_main(options) -> None:
    """``trunk export CKPT DIR --task NAME``: one task's head and delta as a task directory."""
    from trunk.formats.task_dir import save_task
    from trunk.formats.trunk_dir import load_pretrained

    others = [
        flag
        for flag, given in (
            ("--trunk-only", options.trunk_only),
            ("--onnx", options.onnx),
            ("--push-to-hub", options.push_to_hub),
            ("--wandb-project", options.wandb_project),
        )
        if given
    ]
    if others:
        sys.exit(
            f"error: --task writes a task directory without its trunk; {', '.join(others)} applies to trunk "
            "directories. Export the trunk separately (`trunk export CKPT DIR`)."
        )
    try:
        pretrained = load_pretrained(options.ckpt)
        path = save_task(options.dir, pretrained, options.task, options.overwrite)
    except (FileNotFoundError, FileExistsError, ValueError) as err:
        sys.exit(f"error: {err}")
    size = sum(f.stat().st_size for f in path.iterdir())
    peft = pretrained.heads[options.task]["meta"].get("peft")
    print(
        f"Wrote {path}: task '{options.task}' ({'its head and ' + peft['method'] + ' delta' if peft else 'its head'}, "
        f"{size / 1024:.0f} KiB). Load it with the trunk it was trained on: load([TRUNK, '{path}']), "
        f"--model.init_from=[TRUNK,{path}] or `trunk serve TRUNK {path}`"
        + (
            "."
            if peft
            else "; this head was trained with the whole trunk, so TRUNK is this run's (`trunk export CKPT DIR "
            "--trunk-only`)."
        )
    )
