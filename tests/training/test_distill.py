"""Distillation (model.distill): teachers' answers as soft targets, per kind, in the student's label order and through
the student's or their own tokenizer; a shallower student from its teacher's blocks (model.init_layers); bad inputs
refused before any step."""

import csv
import os
import random
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import logged_metrics, write_rows
from kinds import DATA_FILES, KINDS
from safetensors.torch import load_file
from test_matrix import kind_args
from test_multitask import TRUNK, ner_task, sentiment_task, trainer

from trunk.cli import export_main, run_cli
from trunk.tasks import load
from trunk.tasks.objectives.base import soft_cross_entropy

# no dropout anywhere: a student that computes what its teacher computes then has a distillation loss of 0
EXACT = [*TRUNK, "--model.trunk.dropout=0", "--model.trunk.attn_dropout=0", "--trainer.precision=32"]
NO_HEAD_DROPOUT = "--model.tasks.sentiment.init_args.head_dropout=0"


def test_soft_cross_entropy_is_hintons_kl_scaled_by_t_squared():
    student, teacher = torch.randn(5, 4), torch.randn(5, 4)
    for t in (1.0, 2.0, 4.0):
        expected = F.kl_div((student / t).log_softmax(-1), (teacher / t).softmax(-1), reduction="batchmean") * t * t
        got = soft_cross_entropy(student, teacher.softmax(-1), t)  # teachers hand over probabilities
        assert torch.allclose(got, expected, atol=1e-5), (t, got, expected)
    assert soft_cross_entropy(teacher, teacher.softmax(-1), 3.0).abs() < 1e-5
    # a row's missing candidates (multiple choice): -inf for the student, probability 0 from the teacher
    missing = torch.tensor([[1.0, 2.0, float("-inf")]])
    loss = soft_cross_entropy(missing, torch.tensor([[0.3, 0.7, 0.0]]), 2.0)
    assert torch.isfinite(loss) and loss >= 0


@pytest.fixture(scope="module")
def teacher(tmp_path_factory) -> tuple[dict, Path]:
    """A sentiment model trained with its labels in the order [positive, negative] (the data's is [negative, positive]),
    with no dropout, and its files."""
    root = tmp_path_factory.mktemp("teacher")
    rng = random.Random(0)
    files = {split: write_rows(root / f"{split}.csv", [polar_example(rng) for _ in range(n)])
             for split, n in (("train", 256), ("validation", 64), ("test", 64))}
    cli = run_cli(["fit", *EXACT, *sentiment_task(files), NO_HEAD_DROPOUT,
                   "--data.tasks.sentiment.label_names=[positive, negative]", *trainer(root / "run", epochs=3)])
    assert cli.trainer.callback_metrics["test/sentiment/acc"] > 0.9  # a teacher worth learning from
    return files, next((root / "run").rglob("last.ckpt"))


def polar_example(rng: random.Random) -> dict:
    """A sentence whose one telling word says its label: a tiny trunk learns it in a few epochs."""
    label = rng.choice(["negative", "positive"])
    word = rng.choice({"positive": ["great", "good", "lovely"], "negative": ["bad", "awful", "dull"]}[label])
    filler = rng.choices(["the", "film", "plot", "was", "quite", "and", "music", "cast", "felt"], k=rng.randint(3, 8))
    filler.insert(rng.randrange(len(filler) + 1), word)
    return {"text": " ".join(filler), "label": label}


def distill(ckpt, **options) -> str:
    values = ", ".join(f"{k}: {v}" for k, v in {"teachers": f"[{ckpt}]", **options}.items())
    return f"--model.distill={{sentiment: {{{values}}}}}"


def test_a_student_that_computes_its_teachers_function_has_nothing_to_learn_from_it(teacher, tmp_path):
    """Started from the teacher's weights, its labels in the other order: the rows follow the names, the teacher's
    answers are put in the student's order, and the distillation loss is 0 from the first step (a misaligned label
    order would make it large)."""
    files, ckpt = teacher
    run_cli(["fit", *EXACT, *sentiment_task(files), NO_HEAD_DROPOUT, f"--model.init_from={ckpt}",
             "--model.optimizer.lr=1e-12", distill(ckpt, alpha=1.0), *trainer(tmp_path / "s", epochs=1)])
    logged = logged_metrics(tmp_path / "s")
    assert logged["train/sentiment/distill_loss_epoch"] < 1e-5, logged


def test_a_student_learns_its_teachers_answers_with_alpha_1_and_not_its_labels(teacher, tmp_path):
    """With alpha 1 the labels count nothing: a student given every label flipped still learns to answer as its
    teacher does, and its distillation loss falls."""
    files, ckpt = teacher
    flipped = dict(files)
    rows = files["train"].read_text().replace("positive", "§").replace("negative", "positive").replace("§", "negative")
    flipped["train"] = tmp_path / "flipped.csv"
    flipped["train"].write_text(rows)
    run_cli(["fit", *EXACT, *sentiment_task(flipped), distill(ckpt, alpha=1.0, temperature=1.0),
             *trainer(tmp_path / "s", epochs=4)])
    student, tutor = load(next((tmp_path / "s").rglob("last.ckpt"))), load(ckpt)
    texts = [line.split(",")[0] for line in files["test"].read_text().splitlines()[1:]]
    agree = sum(a["label"] == b["label"] for a, b in zip(student.predict(texts), tutor.predict(texts))) / len(texts)
    assert agree > 0.8, agree
    with next((tmp_path / "s").rglob("metrics.csv")).open() as f:
        epochs = [float(v) for row in csv.DictReader(f) if (v := row.get("train/sentiment/distill_loss_epoch"))]
    assert len(epochs) == 4 and epochs[-1] < epochs[0], epochs


def test_a_teacher_with_another_tokenizer_reads_the_raw_texts_with_its_own(teacher, tmp_path):
    """A student trained from scratch with another vocabulary: the teacher encodes each batch's texts itself, and
    what it hands over is what it predicts for them."""
    from trunk.inference.teachers import attach_teachers

    files, ckpt = teacher
    cli = run_cli([*EXACT, *sentiment_task(files), distill(ckpt, precision="32-true"),
                   *trainer(tmp_path / "s", epochs=1), "--data.tokenizer_vocab_size=40"], run=False)
    model = cli.model
    attach_teachers(model)
    teachers = model.teachers["sentiment"]
    assert not teachers.members[0].reads_batches  # another tokenizer
    data = cli.datamodule
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))
    got = teachers.to(torch.device("cpu")).soft_targets(batch)
    own = load(ckpt, precision="32-true").predict(batch["text"])
    names = model.objective("sentiment").label_names
    expected = torch.tensor([[record["probs"][name] for name in names] for record in own])
    assert torch.allclose(got, expected, atol=1e-5)


def test_ner_teachers_answer_word_by_word_across_tokenizers(ner_files, tmp_path):
    """NER's soft targets are per word (at each word's first piece), so a student of another tokenizer reads them at
    its own first pieces."""
    from trunk.inference.teachers import attach_teachers

    run_cli(["fit", *EXACT, *ner_task(ner_files), *trainer(tmp_path / "t", epochs=1)])
    ckpt = next((tmp_path / "t").rglob("last.ckpt"))
    cli = run_cli([*EXACT, *ner_task(ner_files), f"--model.distill={{ner: {{teachers: [{ckpt}], precision: 32-true}}}}",
                   *trainer(tmp_path / "s", epochs=1), "--data.tokenizer_vocab_size=150"], run=False)
    attach_teachers(cli.model)
    cli.datamodule.setup("fit")
    batch = next(iter(cli.datamodule.train_dataloader()))
    targets = cli.model.teachers["ner"].to(torch.device("cpu")).soft_targets(batch)
    assert targets.shape[:2] == batch["word_starts"].shape
    words = batch["word_starts"] >= 0
    assert torch.allclose(targets[words].sum(-1), torch.ones(int(words.sum())), atol=1e-5)
    # the teacher's own reading of the first sentence, word by word
    tutor = load(ckpt, precision="32-true")
    own = tutor.model.objective("ner")
    example = tutor.preprocessors["ner"].collate(tutor.preprocessors["ner"].encode([batch["words"][0]]))
    with torch.no_grad():
        expected = own.soft_targets(tutor.model.trunk, example)[0]
    n = int(batch["num_words"][0])
    assert torch.allclose(targets[0, :n], expected[:n], atol=1e-5)
    loss = cli.model.objective("ner").distill_loss(cli.model.objective("ner")(cli.model.trunk, batch), targets, batch,
                                                   2.0)
    assert torch.isfinite(loss) and loss > 0


@pytest.mark.parametrize("options, message", [
    ({"alpha": 1.5}, r"alpha=1.5 \(must be in \[0, 1\]\)"),
    ({"temperature": 0}, r"temperature=0 \(must be > 0"),
    ({"task": "reviews"}, r"has no head for the task 'reviews'; its tasks are \['sentiment'\]"),
    ({"sequence": "true"}, r"sequence: learning from the teachers' outputs as targets is for translation"),
    ({"sequence": "true", "layers": "[[0, 0]]", "relations": 1.0}, r"sequence with layers"),
])
def test_bad_distillation_options_are_refused_before_any_step(teacher, tmp_path, options, message):
    files, ckpt = teacher
    with pytest.raises(ValueError, match=f"model.distill.sentiment.*{message}"):
        run_cli(["fit", *EXACT, *sentiment_task(files), distill(ckpt, **options), *trainer(tmp_path / "s")])
    assert not list(tmp_path.rglob("*.ckpt"))


def test_a_teacher_of_other_labels_or_another_kind_is_refused_naming_both(teacher, ner_files, tmp_path):
    files, ckpt = teacher
    relabelled = tmp_path / "train.csv"
    relabelled.write_text(files["train"].read_text().replace("positive", "good"))
    with pytest.raises(ValueError, match=re.escape("only the teacher's: ['positive']; only this task's: ['good']")):
        run_cli(["fit", *EXACT, *sentiment_task({**files, "train": relabelled}), distill(ckpt),
                 *trainer(tmp_path / "a")])
    run_cli(["fit", *EXACT, *ner_task(ner_files), *trainer(tmp_path / "ner", epochs=1)])
    ner_ckpt = next((tmp_path / "ner").rglob("last.ckpt"))
    with pytest.raises(ValueError, match="is token_classification, and this task is sequence_classification"):
        run_cli(["fit", *EXACT, *sentiment_task(files), distill(ner_ckpt, task="ner"), *trainer(tmp_path / "b")])
    with pytest.raises(ValueError, match="model.distill.sentiment.teachers: .*missing.ckpt"):
        run_cli(["fit", *EXACT, *sentiment_task(files), distill(tmp_path / "missing.ckpt"), *trainer(tmp_path / "c")])
    assert not list(tmp_path.glob("[abc]/**/*.ckpt"))


def test_a_shallower_student_starts_from_the_chosen_blocks_of_its_teacher(teacher, tmp_path):
    files, ckpt = teacher
    deep = ["--model.trunk.n_layers=4"]
    run_cli(["fit", *EXACT, *deep, *sentiment_task(files), *trainer(tmp_path / "t", epochs=1)])
    four = next((tmp_path / "t").rglob("last.ckpt"))
    cli = run_cli([*EXACT, *sentiment_task(files), f"--model.init_from={four}", "--model.init_layers=[3, 1]",
                   *trainer(tmp_path / "s")], run=False)
    assert cli.model.trunk_config.n_layers == 2
    source = torch.load(four, weights_only=True)["state_dict"]
    blocks = cli.model.trunk.backbone.blocks
    for new, old in ((0, 3), (1, 1)):
        for key, value in blocks[new].state_dict().items():
            assert torch.equal(value, source[f"trunk.backbone.blocks.{old}.{key}"]), (new, old, key)
    every = run_cli([*EXACT, *sentiment_task(files), f"--model.init_from={four}",
                     "--model.init_layers=every_other", *trainer(tmp_path / "e")], run=False)
    assert every.model.trunk_config.n_layers == 2
    with pytest.raises(SystemExit, match=r"a list of distinct block numbers of the 4 .* \(0 to 3\)"):
        run_cli([*EXACT, *sentiment_task(files), f"--model.init_from={four}", "--model.init_layers=[0, 4]",
                 *trainer(tmp_path / "x")], run=False)


@pytest.mark.parametrize("name", KINDS)
def test_every_kind_distills_or_says_it_cannot(name, request, tmp_path):
    """Each kind with a distillation loss: its soft targets, read back by the same model, cost nothing (0 in eval mode:
    the targets and the loss agree on their form), and with alpha 0 a distilled step's loss is the task's own. Each
    kind without one is refused by name. (`trunk fit` of a student: the tests above, for classification and NER.)"""
    from trunk.inference.teachers import TaskTeachers
    from trunk.training.distill import DistillConfig, distill_configs

    kind = KINDS[name]
    files = {source: request.getfixturevalue(f"{source}_files") for source in set(DATA_FILES.values()) - {None}}
    args = kind_args(kind, files, tmp_path / "teacher")
    fit = run_cli(["fit", *args])
    ckpt = next((tmp_path / "teacher").rglob("last.ckpt"))
    option = f"--model.distill={{t: {{teachers: [{ckpt}], precision: 32-true}}}}"
    if not fit.model.objective("t").distills:
        with pytest.raises(ValueError, match=f"model.distill.t: task 't' is {name}, which has no distillation loss"):
            run_cli([*args, option], run=False)
        return
    predictor = load(ckpt, precision="32-true")
    student = predictor.model
    teachers = TaskTeachers(student, "t", DistillConfig(teachers=[str(ckpt)], precision="32-true"),
                            [(str(ckpt), load(ckpt, precision="32-true"))]).to(torch.device("cpu"))
    fit.datamodule.setup("fit")
    batch = next(iter(fit.datamodule.train_dataloader()))
    objective = student.objective("t")
    with torch.no_grad():
        output = objective.distill_output(student.trunk, batch)
        loss = objective.distill_loss(output, teachers.soft_targets(batch), batch, 2.0)
    assert abs(float(loss)) < 1e-5, float(loss)
    if objective.stem == "image":  # a student normalising its images otherwise: the teacher reads them as its own
        import copy

        other = copy.copy(fit.datamodule.tasks["t"])
        other.mean, other.std = [0.5] * len(other.mean), [0.25] * len(other.std)
        shifted = TaskTeachers(student, "t", DistillConfig(teachers=[str(ckpt)], precision="32-true"),
                               [(str(ckpt), load(ckpt, precision="32-true"))], data=other).to(torch.device("cpu"))
        assert shifted.members[0].pixels is not None
        rows = list(range(len(batch["labels"])))
        own, theirs = (d.make_batch("train", rows, train=False) for d in (fit.datamodule.tasks["t"], other))
        assert not torch.allclose(own["pixel_values"], theirs["pixel_values"])
        assert torch.allclose(shifted.soft_targets(theirs), teachers.soft_targets(own), atol=1e-5)
    # alpha 0: a labelled batch's loss is the task's own (every kind's labels are seen, whatever their batch keys)
    student.distill = distill_configs({"t": {"teachers": [str(ckpt)], "alpha": 0.0}}, dict(student.objectives))
    student.attach_teachers("t", teachers)
    with torch.no_grad():
        assert torch.allclose(student._distilled_loss("t", objective, batch), objective.loss(student.trunk, batch,
                                                                                             "train"), atol=1e-6)


def test_unlabelled_inputs_train_through_the_teachers_in_batches_of_their_own(teacher, tmp_path):
    """``data.tasks.<task>.unlabelled``: a text file of inputs read as a predict file is, in batches without labels
    shuffled among the labelled ones; their loss is the teachers' alone. Without teachers they are refused."""
    files, ckpt = teacher
    rows = files["train"].read_text().splitlines()
    few = tmp_path / "few.csv"
    few.write_text("\n".join(rows[:33]) + "\n")  # the header and 32 labelled rows
    texts = tmp_path / "more.txt"
    texts.write_text("".join(line.rsplit(",", 1)[0] + "\n" for line in rows[33:]))  # 224 inputs, one per line
    args = [*EXACT, *sentiment_task({**files, "train": few}), f"--data.tasks.sentiment.unlabelled={texts}"]
    with pytest.raises(SystemExit, match="unlabelled gives inputs without labels.*model.distill.sentiment.teachers"):
        run_cli([*args, *trainer(tmp_path / "none")], run=False)
    cli = run_cli(["fit", *args, distill(ckpt), *trainer(tmp_path / "s", epochs=1)])
    assert cli.trainer.global_step == 2 + 14  # 32 labelled rows and 224 unlabelled, 16 a batch
    batches = list(cli.datamodule.train_dataloader())
    assert sum("labels" not in b for b in batches) == 14 and sum("labels" in b for b in batches) == 2
    assert {len(b["text"]) for b in batches if "labels" not in b} == {16}
    assert all(bool(b.get("unlabelled")) == ("labels" not in b) for b in batches)
    with pytest.raises(ValueError, match="ImageClassificationData: unlabelled inputs are read by text classification"):
        from trunk.datamodules import ImageClassificationData

        ImageClassificationData(dataset="trunk:shapes", train="train", unlabelled="test")
    assert logged_metrics(tmp_path / "s")["train/sentiment/distill_loss_epoch"] > 0


def test_kept_answers_are_the_teachers_own_and_serve_the_next_run(teacher, tmp_path):
    """cache: the first epoch's answers are kept by row, written once every row has one, and a second run reads them
    instead of asking the teachers (whose answers they equal)."""
    files, ckpt = teacher
    args = [*EXACT, *sentiment_task(files), distill(ckpt, cache="true", precision="32-true")]
    first = run_cli(["fit", *args, *trainer(tmp_path / "a", epochs=2)])
    kept = list((Path(os.environ["TRUNK_CACHE"]) / "teachers").glob("*.safetensors"))
    cache = first.model.teachers["sentiment"].cache
    assert cache.saved and cache.path in kept and len(cache.answers) == 256
    # the teacher ran in the first epoch only (16 batches of 16): the second one's answers were the kept ones
    assert first.model.teachers["sentiment"].passes == 16 and first.trainer.global_step == 32
    batch = next(iter(first.datamodule.train_dataloader()))
    asked = first.model.teachers["sentiment"]
    asked_cache, asked.cache = asked.cache, None
    with torch.no_grad():
        fresh = asked.soft_targets(batch)
    assert torch.allclose(asked_cache.get(batch["rows"]), fresh, atol=1e-6)
    second = run_cli(["fit", *args, *trainer(tmp_path / "b", epochs=1)])
    assert second.model.teachers["sentiment"].cache.saved  # read, not written: every row answered from the file
    assert second.model.teachers["sentiment"].passes == 0
    assert logged_metrics(tmp_path / "b")["train/sentiment/distill_loss_epoch"] > 0


def test_a_resumed_run_refuses_teachers_that_changed_since_it_began(teacher, tmp_path):
    files, ckpt = teacher
    copy = tmp_path / "teacher.ckpt"
    copy.write_bytes(ckpt.read_bytes())
    args = [*EXACT, *sentiment_task(files), distill(copy), *trainer(tmp_path / "s", epochs=1)]
    assert run_cli(["fit", *args]).model.teachers["sentiment"].passes == 16  # without cache: one a step
    resumed = run_cli(["fit", *args, "--trainer.max_epochs=2", "--ckpt_path=last"])  # the same teachers: it goes on
    assert resumed.trainer.global_step == 2 * 16
    assert resumed.model.teachers["sentiment"].passes == 2 * 16  # counted on from the checkpoint's
    copy.write_bytes(next((tmp_path / "s").rglob("last.ckpt")).read_bytes())  # retrained: another model of the task
    with pytest.raises(ValueError, match=r"model.distill.sentiment: the teachers .* are not the ones this run began "
                                         r"with"):
        run_cli(["fit", *args, "--trainer.max_epochs=3", "--ckpt_path=last"])


def test_the_blocks_insides_hidden_states_and_attention_relations(teacher, tmp_path):
    """layers: a student with its teacher's weights has nothing to learn from its insides either (0); a fresh one does,
    and the relation loss compares trunks of different widths."""
    from trunk.training.distill import relation_kl

    files, ckpt = teacher
    inner = "layers: [[0, 0], [1, 1]], hidden: 1.0, relations: 1.0, alpha: 1.0"
    option = distill(ckpt).replace("]}}", f"], {inner}}}}}")
    run_cli(["fit", *EXACT, *sentiment_task(files), NO_HEAD_DROPOUT, f"--model.init_from={ckpt}",
             "--model.optimizer.lr=1e-12", option, *trainer(tmp_path / "same", epochs=1)])
    assert logged_metrics(tmp_path / "same")["train/sentiment/intermediate_loss_epoch"] < 1e-5
    run_cli(["fit", *EXACT, *sentiment_task(files), option, *trainer(tmp_path / "fresh", epochs=1)])
    assert logged_metrics(tmp_path / "fresh")["train/sentiment/intermediate_loss_epoch"] > 1e-3
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]).bool()
    narrow, wide = torch.randn(2, 4, 32), torch.randn(2, 4, 64)
    assert relation_kl(narrow, narrow, mask, 4) < 1e-6 < relation_kl(narrow, wide, mask, 4)
    # a wider student (64 against 32) reads its hidden states through a learned projection to the teacher's width:
    # trained (it moves), checkpointed and resumed, kept out of what the student exports and loads
    wide = run_cli(["fit", *EXACT, *sentiment_task(files), option, *trainer(tmp_path / "w", epochs=1),
                    "--model.trunk.d_model=64"])
    projection = wide.model.projections["sentiment"].weight
    assert projection.shape == (32, 64) and any(projection is p for g in wide.trainer.optimizers[0].param_groups
                                                for p in g["params"])
    ckpt_w = next((tmp_path / "w").rglob("last.ckpt"))
    saved = torch.load(ckpt_w, weights_only=True)["state_dict"]["projections.sentiment.weight"]
    assert torch.equal(saved, projection.detach())
    resumed = run_cli(["fit", *EXACT, *sentiment_task(files), option, *trainer(tmp_path / "w", epochs=2),
                       "--model.trunk.d_model=64", "--ckpt_path=last"])
    assert resumed.trainer.global_step == 2 * 16 and not torch.equal(resumed.model.projections["sentiment"].weight,
                                                                     saved)
    student = load(ckpt_w)  # no teachers, no projection: the student alone
    assert not student.model.projections and student.predict(["a fine film"])[0]["label"] in ("negative", "positive")
    export_main([str(ckpt_w), str(tmp_path / "w_dir")])
    assert not any("projections" in key for key in load_file(tmp_path / "w_dir" / "model.safetensors"))
    with pytest.raises(ValueError, match=r"layers compares the blocks of the student and of one teacher that reads its "
                                         r"tokens: give one teacher, with the student's tokenizer"):
        run_cli(["fit", *EXACT, *sentiment_task(files), option, *trainer(tmp_path / "v", epochs=1),
                 "--data.tokenizer_vocab_size=40"])
    with pytest.raises(ValueError, match=r"layers: \[\[0, 2\]\] name blocks beyond the student's 2 or the teacher's 2"):
        run_cli(["fit", *EXACT, *sentiment_task(files), option.replace("[1, 1]", "[0, 2]"),
                 *trainer(tmp_path / "x", epochs=1)])


def test_sequence_level_distillation_trains_on_the_teachers_translations(reversal_files, tmp_path):
    """sequence: the teacher's beam translations of each source (what it translates), framed as the data frames a
    reference (a reference handed over as a translation frames to the batch as it was), kept by row with cache and read
    from there in the second epoch; the student's loss on them; a translation's word-level answers (one per target
    position, not per row) are not kept by row."""
    from trunk.inference.teachers import TaskTeachers
    from trunk.training.distill import DistillConfig

    args = kind_args(KINDS["translation"], {"reversal": reversal_files}, tmp_path / "teacher")
    fit = run_cli(["fit", *args])
    ckpt = next((tmp_path / "teacher").rglob("last.ckpt"))
    tutor = load(ckpt, precision="32-true")
    config = DistillConfig(teachers=[str(ckpt)], precision="32-true", sequence=True)
    teachers = TaskTeachers(tutor.model, "t", config, [(str(ckpt), tutor)]).to(torch.device("cpu"))
    fit.datamodule.setup("fit")
    batch = next(iter(fit.datamodule.train_dataloader()))
    objective, tokenizer = tutor.model.objective("t"), tutor.model.codec.target("t")
    sequences = teachers.soft_targets(batch)
    eos = objective.generation_ids.eos
    said = tokenizer.decode_batch([row[: row.index(eos)] for row in sequences.tolist()], skip_special_tokens=True)
    assert said == objective.translate(tutor.model.trunk, batch)
    references = batch["labels"].clamp(min=0)  # each row's target ids and end, 0s after
    framed = objective.with_targets(batch, references)
    assert torch.equal(framed["decoder_input_ids"], batch["decoder_input_ids"])
    assert torch.equal(framed["labels"], batch["labels"]) and torch.equal(framed["input_ids"], batch["input_ids"])
    with pytest.raises(ValueError, match="translation's answers are not one fixed answer per training row"):
        TaskTeachers(tutor.model, "t", DistillConfig(teachers=[str(ckpt)]), [(str(ckpt), tutor)]).keep_answers(
            ["key"], lambda: 1)

    option = f"--model.distill={{t: {{teachers: [{ckpt}], sequence: true, cache: true, alpha: 1.0}}}}"
    student = run_cli(["fit", *args, option, "--trainer.max_steps=-1", "--trainer.max_epochs=2",
                       f"--trainer.default_root_dir={tmp_path / 'student'}"])
    cache = student.model.teachers["t"].cache
    assert cache.saved and len(cache.answers) == student.datamodule.tasks["t"].train_rows()
    assert logged_metrics(tmp_path / "student")["train/t/distill_loss_epoch"] > 0


def test_a_teacher_predicts_in_the_form_measured_fastest_or_the_one_asked_for(teacher, tmp_path, timed):
    """precision auto: the teacher on a CPU where int8 measures fastest computes in int8; asked for 32-true, in fp32."""
    from trunk.inference.quantize import Int8Linear
    from trunk.inference.teachers import attach_teachers

    files, ckpt = teacher
    timed.seconds = {"fp32": 1.0, "bf16": 0.7, "int8": 0.5, "int8 + bf16": 0.6}
    for options, int8 in (({}, True), ({"precision": "32-true"}, False)):
        model = run_cli([*EXACT, *sentiment_task(files), distill(ckpt, **options), *trainer(tmp_path / "s")],
                        run=False).model
        attach_teachers(model)
        tutor = model.teachers["sentiment"].to(torch.device("cpu")).members[0].predictor
        assert tutor.precision == "32-true"
        assert any(isinstance(m, Int8Linear) for m in tutor.model.modules()) is int8
