"""Every task kind (tests/kinds.py) through every path: fit -> validate -> test -> predict with --ckpt_path ->
checkpoint round trip (trunk.tasks.load) -> export -> load of the directory -> a new run from it
(model.init_from), with a label-order case on every reuse path of a labelled kind -> a delta on the frozen trunk
(LoRA or an adapter), exported as a task directory and loaded beside the trunk."""

import json
from pathlib import Path

import pytest
import torch
from conftest import single_task
from kinds import DATA_FILES, KINDS

from trunk.cli import export_main, run_cli
from trunk.tasks import load

TRUNK = ["--model.trunk.d_model=32", "--model.trunk.n_layers=2", "--model.trunk.n_heads=4", "--model.trunk.d_ff=64",
         "--model.trunk.max_len=128", "--model.trunk.dropout=0.0", "--model.trunk.attn_dropout=0.0"]


def kind_args(kind, files, root) -> list[str]:
    task = single_task(
        [
            f"--model={kind.objective}",
            *kind.objective_args,
            f"--data={kind.data}",
            *kind.data_args(files),
            "--data.batch_size=16",
        ],
        "t",
    )
    return [
        *task,
        *TRUNK,
        "--data.tokenizer_vocab_size=300",
        "--trainer.accelerator=cpu",
        "--trainer.devices=1",
        "--trainer.max_steps=6",
        "--trainer.max_epochs=1",
        "--trainer.precision=32-true",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        f"--trainer.default_root_dir={root}",
        "--seed_everything=0",
    ]


def test_the_matrix_runs_every_kind_of_the_registry_and_the_readme_lists_them():
    """One table of kinds (``trunk.tasks.registry.KINDS``): every kind in it runs here, its data class says it feeds
    that kind, and the README's table of kinds names its objective and data class."""
    from conftest import REPO

    from trunk.tasks.registry import KINDS as REGISTRY

    assert set(KINDS) == set(REGISTRY)
    readme = (REPO / "README.md").read_text()
    for name, kind in REGISTRY.items():
        assert name in kind.data.kinds and kind.objective.kind == name
        assert f"`{kind.objective.__name__}`" in readme and f"`{kind.data.__name__}`" in readme, name


@pytest.mark.parametrize("name", KINDS)
def test_every_task_kind_on_every_path(name, request, tmp_path):
    kind = KINDS[name]
    files = {source: request.getfixturevalue(f"{source}_files") for source in set(DATA_FILES.values()) - {None}}
    args = kind_args(kind, files, tmp_path / "run")
    fit = run_cli(["fit", *args])
    ckpt = fit.trainer.checkpoint_callback.last_model_path or fit.trainer.checkpoint_callback.best_model_path
    labels = list(kind.labels) if kind.labels else None
    assert fit.model.objectives["t"].label_names == labels

    metrics = run_cli(["validate", *args, f"--ckpt_path={ckpt}"]).trainer.callback_metrics
    assert "val/t/loss" in metrics and torch.isfinite(metrics["val/t/loss"])
    if "test" in kind.splits:
        tested = run_cli(["test", *args, f"--ckpt_path={ckpt}"]).trainer.callback_metrics
        assert "test/score" in tested
    if labels:  # the labels named in another order: the same answers (trunk.assembly.run matches them by name)
        swapped = f"--data.tasks.t.{kind.label_option}={json.dumps(labels[::-1])}"
        again = run_cli(["validate", *args, f"--ckpt_path={ckpt}", swapped]).trainer.callback_metrics
        assert again["val/t/loss"].item() == pytest.approx(metrics["val/t/loss"].item(), rel=1e-5)

    export_main([ckpt, str(tmp_path / "exported"), *(["--onnx"] if kind.onnx else [])])
    if kind.onnx:
        onnx_matches_pytorch(tmp_path / "exported")
    else:
        with pytest.raises(SystemExit, match="has no task that exports to ONNX"):
            export_main([ckpt, str(tmp_path / "exported_onnx"), "--onnx"])
    if kind.inputs:
        out = tmp_path / "predictions.jsonl"
        run_cli(["predict", *args, f"--ckpt_path={ckpt}", f"--predictions.output={out}"])
        assert out.read_text().strip()
        # a trained model predicts without its data files (the training figures travel with it): every file beside them
        # is moved away
        away = {
            path
            for source in files.values()
            for split in source.values()
            for path in Path(split).parent.iterdir()
            if path.is_file()
        }
        for path in away:
            path.rename(path.with_name(path.name + ".away"))
        try:
            from_checkpoint, from_directory = load(ckpt), load(tmp_path / "exported")
        finally:
            for path in away:
                path.with_name(path.name + ".away").rename(path)
        records = from_checkpoint.predict(list(kind.inputs))
        assert len(records) == len(kind.inputs) and records == from_directory.predict(list(kind.inputs))
        if kind.onnx:  # ONNX Runtime through the same predict path: the same records as fp32 PyTorch (what the graphs
            # compute; `auto` may be bf16 here), numbers within the graphs' tolerance
            through_onnx = load(tmp_path / "exported", runtime="onnx").predict(list(kind.inputs))
            in_fp32 = load(tmp_path / "exported", precision="32-true").predict(list(kind.inputs))
            assert same_records(through_onnx, in_fp32, 1e-4), (through_onnx, in_fp32)

    # a new run from the exported directory: the trunk and the head carry over
    reuse = run_cli(
        [*args, f"--model.init_from={tmp_path / 'exported'}", f"--trainer.default_root_dir={tmp_path / 'reuse'}"],
        run=False,
    )
    trained = fit.model.state_dict()
    for key, value in reuse.model.state_dict().items():
        if key.startswith(("trunk.", "objectives.t.")) and "_metrics." not in key:
            assert torch.equal(value, trained[key]), key
    if labels:  # the same labels in another order: the classifier's rows follow the names
        flipped = run_cli(
            [
                *args,
                f"--model.init_from={tmp_path / 'exported'}",
                f"--data.tasks.t.{kind.label_option}={json.dumps(labels[::-1])}",
                f"--trainer.default_root_dir={tmp_path / 'flipped'}",
            ],
            run=False,
        )
        assert flipped.model.objectives["t"].label_names == labels[::-1]
        rows = [f"objectives.t.{key}" for key in type(flipped.model.objectives["t"]).label_keys]
        assert rows
        for key in rows:
            assert torch.equal(flipped.model.state_dict()[key], trained[key].flip(0)), key

    # a delta on the frozen trunk (model.peft: LoRA, an adapter, DoRA with norm shifts, an adapter with norm shifts, by
    # turns), kept as a task directory that answers on the trunk
    deltas = (
        "method: lora",
        "method: adapter",
        "method: lora, norms: true, dora: true",
        "method: adapter, norms: true",
    )
    peft = f"--model.peft={{t: {{{deltas[list(KINDS).index(name) % 4]}, r: 2}}}}"
    if fit.model.objectives["t"].exports_trunk:  # pretraining: a frozen trunk would export untrained
        with pytest.raises(ValueError, match=r"model.peft.t: task 't' \(.*\) pretrains the trunk itself"):
            run_cli([*args, peft], run=False)
        return
    export_main([ckpt, str(tmp_path / "bare"), "--trunk-only"])
    lora = run_cli(["fit", *args, f"--model.init_from={tmp_path / 'bare'}", peft, "--trainer.max_steps=2",
                    f"--trainer.default_root_dir={tmp_path / 'lora'}"])
    assert all(torch.equal(v, trained[k]) for k, v in lora.model.state_dict().items() if k.startswith("trunk."))
    lora_ckpt = lora.trainer.checkpoint_callback.last_model_path or lora.trainer.checkpoint_callback.best_model_path
    export_main([lora_ckpt, str(tmp_path / "task"), "--task", "t"])
    if kind.onnx:  # the graph holds the delta: ONNX Runtime answers as PyTorch does with it
        export_main([lora_ckpt, str(tmp_path / "peft_onnx"), "--onnx"])
        onnx_matches_pytorch(tmp_path / "peft_onnx", with_delta=True)
    if kind.inputs:
        assert load([tmp_path / "bare", tmp_path / "task"]).predict(list(kind.inputs)) == load(lora_ckpt).predict(
            list(kind.inputs)
        )


def same_records(got, expected, tolerance: float) -> bool:
    """Records equal as JSON, numbers within ``tolerance``."""
    got, expected = json.loads(json.dumps(got)), json.loads(json.dumps(expected))

    def close(a, b) -> bool:
        if isinstance(a, dict) and isinstance(b, dict):
            return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
        if isinstance(a, list) and isinstance(b, list):
            return len(a) == len(b) and all(map(close, a, b))
        if isinstance(a, float) or isinstance(b, float):
            return isinstance(a, (int, float)) and isinstance(b, (int, float)) and abs(a - b) <= tolerance
        return a == b

    return close(got, expected)


def onnx_matches_pytorch(directory, tolerance: float = 1e-4, with_delta: bool = False):
    """ONNX Runtime's outputs equal PyTorch's (within ``tolerance``) for random token ids of several batch sizes and
    lengths, with padding: the graph's batch and sequence axes are dynamic and it honours the mask."""
    import onnxruntime

    from trunk.formats.onnx import TaskGraph

    predictor = load(directory, precision="32-true")
    listing = json.loads((directory / "onnx" / "tasks.json").read_text())
    assert set(listing) == set(predictor.tasks)
    generator = torch.Generator().manual_seed(0)
    vocab = predictor.model.codec.tokenizer.get_vocab_size()
    for name, entry in listing.items():
        session = onnxruntime.InferenceSession(str(directory / "onnx" / entry["file"]))
        graph = TaskGraph(predictor.model, name).eval()
        for batch, length in ((1, 2), (3, 9), (5, 40)):
            ids = torch.randint(5, vocab, (batch, length), generator=generator)
            mask = torch.ones_like(ids)
            mask[0, length // 2 + 1 :] = 0  # the first row is padded
            ids[mask == 0] = 0
            (out,) = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
            with torch.no_grad():
                expected = graph(ids, mask)
                if with_delta:  # and the delta changes the answer: the comparison is not of the trunk alone
                    assert not torch.allclose(
                        expected, predictor.model.objectives[name].export_forward(predictor.model.trunk, ids, mask)
                    )
            assert out.shape == tuple(expected.shape)
            out = torch.from_numpy(out)
            if expected.dim() == 3:  # per token: padding's outputs mean nothing (eager PyTorch skips those tokens)
                out, expected = out[mask.bool()], expected[mask.bool()]
            torch.testing.assert_close(out, expected, atol=tolerance, rtol=tolerance)


def test_onnx_export_without_its_extra_says_how_to_install_it(monkeypatch, tmp_path):
    import sys

    from trunk.formats.onnx import export_onnx

    monkeypatch.setitem(sys.modules, "onnxscript", None)  # as if not installed
    with pytest.raises(ImportError, match=r"onnxscript is missing\): pip install 'trunk\[onnx\]'"):
        export_onnx(None, tmp_path)


def test_the_onnx_runtime_without_exported_graphs_says_how_to_write_them(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"holds no ONNX graphs .* `trunk export CKPT .* --onnx`"):
        load(tmp_path, runtime="onnx")
    with pytest.raises(ValueError, match="runtime='tensorrt': choose 'torch' or 'onnx'"):
        load(tmp_path, runtime="tensorrt")


TEXT_KINDS = [name for name, kind in KINDS.items() if kind.inputs and name != "image_classification"]


@pytest.mark.parametrize("family", ["bert", "deberta-v2", "mpnet", "modernbert", "albert"])
@pytest.mark.parametrize("name", TEXT_KINDS)
def test_every_text_kind_from_an_imported_checkpoint(name, family, request, tmp_path):
    """The paths of the matrix from a Hugging Face folder of each text family (tests/formats/test_hf.py builds a tiny
    random one; DeBERTa-v3's with token types, so pairs read their segments too): fine-tune, export (ONNX where the
    kind has it), predict from the checkpoint and the directory alike."""
    from test_hf import DEBERTA_V3, tiny

    options = {"deberta-v2": {**DEBERTA_V3, "type_vocab_size": 2, "position_buckets": 16},
               "albert": {"embedding_size": 16}}.get(family, {})  # ALBERT: one block shared by both layers
    tiny(family, tmp_path / "hf", masked_lm=False, max_position_embeddings=128, **options)
    kind = KINDS[name]
    files = {source: request.getfixturevalue(f"{source}_files") for source in set(DATA_FILES.values()) - {None}}
    args = [a for a in kind_args(kind, files, tmp_path / "run") if not a.startswith(("--model.trunk.", "--data.tok"))]
    if family == "albert" and name == "translation":  # its 16-wide embeddings cannot be the 32-wide decoder's logits
        args.append("--model.tasks.t.init_args.share_embeddings=false")
    fit = run_cli(["fit", *args, f"--model.init_from={tmp_path / 'hf'}"])
    # [SEP] (id 8 in BERT's test vocabulary) marks the segments; MPNet's RoBERTa-style </s> (2); ModernBERT has none
    segments, separator = {"mpnet": (0, 2), "modernbert": (0, 8)}.get(family, (2, 8))
    assert fit.model.trunk_config.segments == segments and fit.model.trunk.stems["text"].separator_id == separator
    assert (fit.model.trunk_config.shared_blocks == 1) == (family == "albert")  # ALBERT's one block for both layers
    ckpt = fit.trainer.checkpoint_callback.last_model_path or fit.trainer.checkpoint_callback.best_model_path
    export_main([ckpt, str(tmp_path / "exported"), *(["--onnx"] if kind.onnx else [])])
    if kind.onnx:
        onnx_matches_pytorch(tmp_path / "exported")
    records = load(ckpt).predict(list(kind.inputs))
    assert len(records) == len(kind.inputs) and records == load(tmp_path / "exported").predict(list(kind.inputs))


def vision_folder(family: str, folder):
    """A tiny random transformers vision model of ``family`` (28-pixel images in 7-pixel patches), saved (timm's: a timm
    Hub folder)."""
    import torch
    import transformers

    if family == "timm":
        from test_hf import timm_folder

        return timm_folder(folder)

    shape = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=28,
                 patch_size=7)
    torch.manual_seed(0)
    model = {"vit": lambda: transformers.ViTModel(transformers.ViTConfig(**shape)),
             "dinov2": lambda: transformers.Dinov2Model(transformers.Dinov2Config(**shape)),
             "clip": lambda: transformers.CLIPVisionModel(transformers.CLIPVisionConfig(**shape)),
             "dinov2_with_registers": lambda: transformers.Dinov2WithRegistersModel(
                 transformers.Dinov2WithRegistersConfig(num_register_tokens=2, **shape)),
             "siglip": lambda: transformers.SiglipVisionModel(transformers.SiglipVisionConfig(**shape))}[family]()
    model.save_pretrained(folder)


@pytest.mark.parametrize("family", ["vit", "dinov2", "clip", "dinov2_with_registers", "siglip", "timm"])
def test_image_classification_from_each_imported_vision_family(family, tmp_path):
    """The image kind's paths from a Hugging Face folder of each vision family: fine-tune (the shapes resized to the
    model's 28 pixels, in RGB), export, predict from the checkpoint and the directory alike."""
    pytest.importorskip("transformers")
    vision_folder(family, tmp_path / "hf")
    kind = KINDS["image_classification"]
    args = [a for a in kind_args(kind, {}, tmp_path / "run") if not a.startswith(("--model.trunk.", "--data.tok"))
            and "image_size" not in a]
    args += [f"--model.init_from={tmp_path / 'hf'}", "--model.tasks.t.init_args.image_size=28",
             "--model.tasks.t.init_args.patch_size=7", "--model.tasks.t.init_args.channels=3",
             "--data.tasks.t.init_args.image_size=28", "--data.tasks.t.init_args.channels=3"]
    if family == "siglip":  # no [CLS]: its heads pool by attention, started from its pretrained pooling head
        with pytest.raises(ValueError, match="pooling='cls' reads the \\[CLS\\] token, which this trunk's image stem"):
            run_cli(args, run=False)
        args.append("--model.tasks.t.init_args.pooling=attention")
        from trunk.formats.hf import convert

        built = run_cli(args, run=False).model
        assert built.trunk_config.cls_token is False
        assert torch.equal(built.objectives["t"].head.attention_pool.probe,
                           convert(tmp_path / "hf")[0].pooler["attention_pool.probe"])
    fit = run_cli(["fit", *args])
    ckpt = fit.trainer.checkpoint_callback.last_model_path or fit.trainer.checkpoint_callback.best_model_path
    export_main([ckpt, str(tmp_path / "exported")])
    pixels = torch.rand(3, 28, 28, 3)  # images as stored: height, width, channels
    records = load(ckpt).predict(pixels)
    assert len(records) == 3 and records == load(tmp_path / "exported").predict(pixels)


@pytest.mark.parametrize("family", ["bart", "marian", "m2m_100", "mbart"])
def test_translation_from_each_imported_seq2seq_family(family, request, tmp_path):
    """The translation kind's paths from a Hugging Face folder of each encoder-decoder family, its decoder as the
    task's (``heads_from``): fine-tune, export, predict from the checkpoint and the directory alike. Marian's targets
    are segmented by its own target.spm, which the checkpoint and the directory keep; NLLB's and mBART-50's inputs
    start with the source language's code and their outputs with the target's, which predict may change."""
    pytest.importorskip("transformers")
    from test_hf import tiny_bart
    from test_hf_translation import LANGUAGES, tiny_marian, tiny_multilingual

    build = {"bart": tiny_bart, "marian": tiny_marian}.get(family, lambda folder: tiny_multilingual(family, folder))
    build(tmp_path / "hf")
    english, german, french = LANGUAGES.get(family, (None, None, None))
    languages = [f"--data.tasks.t.init_args.source_language={english}",
                 f"--model.tasks.t.init_args.target_language={german}"] if english else []
    kind = KINDS["translation"]
    files = {source: request.getfixturevalue(f"{source}_files") for source in set(DATA_FILES.values()) - {None}}
    args = [a for a in kind_args(kind, files, tmp_path / "run") if not a.startswith(("--model.trunk.", "--data.tok"))]
    fit = run_cli(["fit", *args, f"--model.init_from={tmp_path / 'hf'}", "--model.heads_from={t: translation}",
                   "--model.tasks.t.init_args.decoder_layers=3", *languages])
    data = fit.datamodule.tasks["t"]
    if english:
        assert fit.model.objectives["t"].decoder_start == "</s>"  # carried with the stored head
        assert data.tokenizer.encode("cat").ids[0] == data.tokenizer.token_to_id(english)
    assert (data.target_tokenizer is not data.tokenizer) == (family == "marian")
    assert (fit.model.codec.target("t") is not fit.model.codec.tokenizer) == (family == "marian")
    ckpt = fit.trainer.checkpoint_callback.last_model_path or fit.trainer.checkpoint_callback.best_model_path
    export_main([ckpt, str(tmp_path / "exported")])
    records = load(ckpt).predict(list(kind.inputs))
    assert len(records) == len(kind.inputs) and records == load(tmp_path / "exported").predict(list(kind.inputs))
    if english:  # another output language at predict time
        model = load(ckpt, options={"t": {"target_language": french, "generation": {"beam_size": 2}}})
        objective = model.model.objectives["t"]
        assert objective.generation_ids.forced == (data.tokenizer.token_to_id(french),)
        assert objective.generation.beam_size == 2 and len(model.predict(list(kind.inputs))) == len(kind.inputs)
        with pytest.raises(ValueError, match=r"\['decoder_layers'\] cannot be set on a trained model"):
            load(ckpt, options={"t": {"decoder_layers": 2}})
