"""Token classification: tag schemes, the entity metric (hand cases, seqeval parity, two processes),
sub-token alignment, constrained decoding, CoNLL reading, the CLI, and bad input."""

import gzip
import itertools
import json
import random
from pathlib import Path

import pytest
import torch
from conftest import single_task, standalone, write_conll

from trunk.cli import run_cli
from trunk.core.tagging import (
    Span,
    allowed_transitions,
    constrained_decode,
    label_names_for,
    parse_label_names,
    spans_from_tags,
    tags_from_spans,
)
from trunk.datamodules import TokenClassificationData, read_conll
from trunk.datamodules.tokenizer import train_wordpiece
from trunk.tasks import EntityF1, load

# -- tag schemes ------------------------------------------------------------------------------------


@pytest.mark.parametrize("tags, expected", [
    # IOB2 / BIO
    ("B-PER I-PER O B-LOC", [("PER", 0, 1), ("LOC", 3, 3)]),
    ("B-PER B-PER", [("PER", 0, 0), ("PER", 1, 1)]),
    # IOB1: I- starts an entity; B- only separates two adjacent entities of one type
    ("I-PER I-PER B-PER O I-LOC", [("PER", 0, 1), ("PER", 2, 2), ("LOC", 4, 4)]),
    # BIOES
    ("B-ORG I-ORG E-ORG S-LOC O S-LOC", [("ORG", 0, 2), ("LOC", 3, 3), ("LOC", 5, 5)]),
    ("B-ORG E-ORG B-ORG E-ORG", [("ORG", 0, 1), ("ORG", 2, 3)]),
    # ill-formed, read like conlleval: I- after O opens an entity; a type change splits
    ("O I-PER I-PER", [("PER", 1, 2)]),
    ("B-PER I-LOC", [("PER", 0, 0), ("LOC", 1, 1)]),
    ("E-PER O", [("PER", 0, 0)]),
    ("O O", []),
])
def test_spans_follow_the_conlleval_reading(tags, expected):
    assert spans_from_tags(tags.split()) == [Span(*s) for s in expected]


def test_iob1_iob2_and_bioes_encodings_of_the_same_entities_read_the_same():
    iob1 = ["I-PER", "I-PER", "B-PER", "O", "I-LOC", "O"]
    iob2 = ["B-PER", "I-PER", "B-PER", "O", "B-LOC", "O"]
    bioes = ["B-PER", "E-PER", "S-PER", "O", "S-LOC", "O"]
    assert spans_from_tags(iob1) == spans_from_tags(iob2) == spans_from_tags(bioes)
    spans = spans_from_tags(iob1)
    assert tags_from_spans(spans, 6, "bio") == iob2 and tags_from_spans(spans, 6, "bioes") == bioes


def random_tags(rng: random.Random, length: int) -> list[str]:
    """Any sequence over O / B / I / E / S of two types: well formed or not."""
    return [rng.choice(["O", "O", "O"] + [f"{p}-{t}" for p in "BIES" for t in ("PER", "LOC")]) for _ in range(length)]


def test_span_reading_matches_seqeval_on_random_sequences():
    from seqeval.metrics.sequence_labeling import get_entities

    rng = random.Random(0)
    for _ in range(2000):
        tags = random_tags(rng, rng.randint(1, 12))
        assert [tuple(s) for s in spans_from_tags(tags)] == get_entities(tags), tags


def test_label_names_and_their_validation():
    assert label_names_for(["PER", "LOC"], "bio") == ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"]
    assert parse_label_names(["O", "B-X", "I-X", "E-X", "S-X"]) == ("bioes", ["X"])
    with pytest.raises(ValueError, match="not a complete BIO label set"):
        parse_label_names(["O", "B-X"])
    with pytest.raises(ValueError, match="is not 'O' or"):
        parse_label_names(["O", "PER"])


# -- the entity metric ---------------------------------------------------------------------------------


def test_entity_f1_on_a_hand_computed_case():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O", "B-PER"]]
    predicted = [["B-PER", "I-PER", "O", "B-ORG"],  # PER right; LOC missed, ORG spurious
                 ["B-ORG", "I-ORG", "B-PER"]]  # ORG has the wrong extent: wrong; PER right
    metric = EntityF1(["LOC", "ORG", "PER"])
    metric.update(predicted, gold)
    result = metric.compute()
    # 2 correct of 4 predicted and of 4 gold: P = R = F1 = 0.5; PER 2/2; LOC 0/0 pred, 0/1 gold; ORG 0/2, 0/1
    assert result["precision"].item() == result["recall"].item() == result["f1"].item() == 0.5
    assert result["f1_PER"].item() == 1.0 and result["f1_LOC"].item() == 0.0 and result["f1_ORG"].item() == 0.0


def test_entity_f1_matches_seqeval_on_random_sequences():
    from seqeval.metrics import classification_report, f1_score, precision_score, recall_score

    rng = random.Random(1)
    gold, predicted = [], []
    for _ in range(300):
        n = rng.randint(1, 10)
        gold.append(random_tags(rng, n))
        predicted.append(random_tags(rng, n) if rng.random() < 0.5 else list(gold[-1]))
    metric = EntityF1(["LOC", "PER"])
    metric.update(predicted, gold)
    result = metric.compute()
    assert result["precision"].item() == pytest.approx(precision_score(gold, predicted))
    assert result["recall"].item() == pytest.approx(recall_score(gold, predicted))
    assert result["f1"].item() == pytest.approx(f1_score(gold, predicted))
    report = classification_report(gold, predicted, output_dict=True)
    assert result["f1_PER"].item() == pytest.approx(report["PER"]["f1-score"])


def _metric_worker(rank: int, world_size: int, init_file: str, gold: list, predicted: list, out: str) -> None:
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    metric = EntityF1(["LOC", "PER"])
    metric.update(predicted[rank::world_size], gold[rank::world_size])  # each process sees half the sentences
    result = {k: v.item() for k, v in metric.compute().items()}
    Path(f"{out}.{rank}").write_text(json.dumps(result))
    torch.distributed.destroy_process_group()


def test_entity_f1_sums_counts_across_two_processes(tmp_path):
    rng = random.Random(2)
    gold = [random_tags(rng, 8) for _ in range(50)]
    predicted = [random_tags(rng, 8) if i % 3 else list(g) for i, g in enumerate(gold)]
    torch.multiprocessing.start_processes(
        _metric_worker,
        args=(2, str(tmp_path / "init"), gold, predicted, str(tmp_path / "out")),
        nprocs=2,
        start_method="fork",
    )
    single = EntityF1(["LOC", "PER"])
    single.update(predicted, gold)
    expected = {k: v.item() for k, v in single.compute().items()}
    halves = [EntityF1(["LOC", "PER"]) for _ in range(2)]
    halves[0].update(predicted[0::2], gold[0::2])
    assert halves[0].compute()["f1"].item() != pytest.approx(expected["f1"])  # one process alone would be wrong
    for rank in range(2):
        assert json.loads((tmp_path / f"out.{rank}").read_text()) == pytest.approx(expected)


# -- decoding ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["bio", "bioes"])
def test_constrained_decoding_finds_the_best_well_formed_sequence(scheme):
    labels = label_names_for(["A", "B"], scheme)
    allowed = allowed_transitions(labels)
    torch.manual_seed(0)
    scores = torch.randn(6, 4, len(labels)).log_softmax(-1)
    lengths = torch.tensor([4, 4, 3, 2, 1, 4])
    decoded = constrained_decode(scores, lengths, allowed)
    for b in range(6):
        n = lengths[b].item()
        best = max(
            (
                path
                for path in itertools.product(range(len(labels)), repeat=n)
                if allowed.start[path[0]]
                and allowed.end[path[-1]]
                and all(allowed.step[i, j] for i, j in zip(path, path[1:]))
            ),
            key=lambda path: sum(scores[b, t, k].item() for t, k in enumerate(path)),
        )
        assert tuple(decoded[b, :n].tolist()) == best
        tags = [labels[i] for i in best]
        assert tags_from_spans(spans_from_tags(tags), n, scheme) == tags  # well formed: survives a round trip


# -- data: CoNLL files, alignment ------------------------------------------------------------------------


def test_read_conll_skips_docstart_and_whitespace_lines_and_reads_gzip(tmp_path):
    text = ("-DOCSTART- -X- O\n\nEU NNP B-ORG\nrejects VBZ O\n \t \nPeter NNP B-PER\nBlackburn NNP I-PER\n\n\n"
            "-DOCSTART- -X- O\nOslo NNP B-LOC\n")
    (tmp_path / "a.txt").write_text(text)
    with gzip.open(tmp_path / "a.txt.gz", "wt") as f:
        f.write(text)
    for name in ("a.txt", "a.txt.gz"):
        ds = read_conll(tmp_path / name)
        assert ds["tokens"] == [["EU", "rejects"], ["Peter", "Blackburn"], ["Oslo"]]
        assert ds["tags"] == [["B-ORG", "O"], ["B-PER", "I-PER"], ["B-LOC"]]
        assert ds["document"] == [0, 0, 1]
    assert read_conll(tmp_path / "a.txt", tag_column=1)["tags"][0] == ["NNP", "VBZ"]


def test_bad_column_files_are_clear_errors(tmp_path):
    (tmp_path / "ragged.txt").write_text("EU NNP B-ORG\nrejects O\n")
    with pytest.raises(ValueError, match=r"ragged.txt:2 has 2 columns but line 1 has 3"):
        read_conll(tmp_path / "ragged.txt")
    (tmp_path / "ok.txt").write_text("EU NNP B-ORG\n")
    with pytest.raises(ValueError, match="data.tag_column=5 does not exist: .* has 3 columns"):
        read_conll(tmp_path / "ok.txt", tag_column=5)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_conll(tmp_path / "missing.txt")
    dm = TokenClassificationData(train=str(tmp_path / "ok.txt"), tag_column=1)
    dm.name = "ner"
    with pytest.raises(ValueError, match="Tag 'NNP' is not 'O' or .* Check data.tasks.ner.tag_column"):
        dm.raw("train")
    # a task's own files name the task's options (not data.tag_column, which no config has)
    bad = TokenClassificationData(train=str(tmp_path / "ok.txt"), tag_column=5)
    bad.name = "ner"
    with pytest.raises(ValueError, match=r"data.tasks.ner.train: data.tasks.ner.tag_column=5 does not exist: .* Set "
                                         r"data.tasks.ner.tag_column to"):
        bad.raw("train")
    missing = TokenClassificationData(train=str(tmp_path / "missing.txt"))
    missing.name = "ner"
    with pytest.raises(FileNotFoundError, match=r"or a split with data.tasks.ner.dataset"):
        missing.raw("train")


@pytest.fixture
def split_words_data(tmp_path) -> TokenClassificationData:
    """A tokenizer that knows 'Mc', '##Gre', '##gor' but not 'McGregor' whole: one word, three sub-tokens."""
    train = write_conll(tmp_path / "train.txt", [[("Ewan", "B-PER"), ("McGregor", "I-PER"), ("left", "O")],
                                                  [("Oslo", "B-LOC"), ("Mc", "O")]])
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    from trunk.core.codec import SPECIAL_TOKENS

    vocab = {t: i for i, t in enumerate([*SPECIAL_TOKENS, "Ewan", "Mc", "##Gre", "##gor", "left", "Oslo"])}
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    return standalone(TokenClassificationData(train=str(train)), tokenizer=str(tmp_path / "tokenizer.json"))


def test_first_subtoken_alignment_labels_each_word_once(split_words_data):
    dm = split_words_data
    example = dm.encode(dm.raw("train"), "train")[0]
    tokens = [dm.tokenizer.id_to_token(i) for i in example["input_ids"]]
    assert len(tokens) > 5  # McGregor really is split into several pieces
    names = dm.label_names
    labels = [names[i] if i >= 0 else None for i in example["labels"]]
    mc = tokens.index("Mc")
    assert labels[mc] == "I-PER" and all(label is None for label in labels[mc + 1 : tokens.index("left")])
    assert labels[0] is None and labels[-1] is None  # [CLS] and [SEP]
    assert example["word_starts"] == [1, mc, tokens.index("left")]
    assert [names[i] for i in example["word_labels"]] == ["B-PER", "I-PER", "O"]


@pytest.mark.parametrize("scheme, expected", [
    ("bio", ["B-PER", "I-PER", "I-PER", "I-PER", "O"]),
    ("bioes", ["B-PER", "I-PER", "I-PER", "E-PER", "O"]),
])
def test_all_subtoken_alignment_retags_entities_over_pieces(split_words_data, scheme, expected):
    dm = split_words_data
    dm.label_all_subtokens, dm.label_scheme, dm._label_names = True, scheme, None
    example = dm.encode(dm.raw("train"), "train")[0]
    tokens = [dm.tokenizer.id_to_token(i) for i in example["input_ids"]]
    assert tokens[1:-1] == ["Ewan", "Mc", "##Gre", "##gor", "left"]
    assert [dm.label_names[i] for i in example["labels"][1:-1]] == expected
    assert example["labels"][0] == example["labels"][-1] == -100
    second = dm.encode(dm.raw("train"), "train")[1]  # a one-word entity: S- in BIOES
    assert dm.label_names[second["labels"][1]] == ("S-LOC" if scheme == "bioes" else "B-LOC")


def test_document_context_surrounds_each_sentence_with_its_own_document_only(tmp_path):
    # two documents of one-word-per-piece sentences: the words are the tokenizer's whole vocabulary
    words = [f"w{i}" for i in range(12)]
    sentences = [[(w, "B-LOC" if i % 3 == 0 else "O") for i, w in enumerate(words[k : k + 3])] for k in range(0, 12, 3)]
    lines = []
    for doc in (sentences[:3], sentences[3:]):
        lines += ["-DOCSTART- -X- -X- O", ""] + [line for s in doc for line in [f"{w} NN O {t}" for w, t in s] + [""]]
    (tmp_path / "docs.txt").write_text("\n".join(lines) + "\n")
    from tokenizers import Tokenizer, models, pre_tokenizers

    from trunk.core.codec import SPECIAL_TOKENS
    tokenizer = Tokenizer(models.WordLevel({t: i for i, t in enumerate([*SPECIAL_TOKENS, *words])}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(tmp_path / "tokenizer.json"))

    def encoded(context_length: int, max_length: int = 128) -> list[list[str]]:
        dm = standalone(TokenClassificationData(train=str(tmp_path / "docs.txt"), context_length=context_length,
                                                max_length=max_length), tokenizer=str(tmp_path / "tokenizer.json"))
        examples = dm.encode(dm.raw("train"), "train")
        for e in examples:  # labels and word starts sit on the sentence itself, never on context
            tokens = [dm.tokenizer.id_to_token(i) for i in e["input_ids"]]
            assert [tokens[p] for p in e["word_starts"]] == e["words"]
            assert [i for i, label in enumerate(e["labels"]) if label != -100] == e["word_starts"]
        return [[dm.tokenizer.id_to_token(i) for i in e["input_ids"]] for e in examples]

    assert encoded(0)[1] == ["[CLS]", "w3", "w4", "w5", "[SEP]"]
    assert encoded(4)[1] == ["[CLS]", "w1", "w2", "w3", "w4", "w5", "w6", "w7", "[SEP]"]  # two each side
    assert encoded(4)[0] == ["[CLS]", "w0", "w1", "w2", "w3", "w4", "w5", "w6", "[SEP]"]  # no left: all on the right
    assert encoded(100)[2] == ["[CLS]", *words[:9], "[SEP]"]  # the end of document 1 ...
    assert encoded(100)[3] == ["[CLS]", "w9", "w10", "w11", "[SEP]"]  # ... is never context for document 2
    assert encoded(100, max_length=7)[1] == ["[CLS]", "w2", "w3", "w4", "w5", "w6", "[SEP]"]  # context fits max_length


def test_unknown_entity_types_at_test_time_are_a_clear_error(ner_files, tmp_path):
    test = write_conll(tmp_path / "odd.txt", [[("Mars", "B-PLANET"), ("is", "O"), ("red", "O")]])
    dm = standalone(TokenClassificationData(train=str(ner_files["train"]), test=str(test)), tokenizer_vocab_size=200)
    with pytest.raises(
        ValueError, match=r"entity types \['PLANET'\] never occur in training; the model knows \['LOC', 'ORG', 'PER'\]"
    ):
        dm.prepare("test")


def test_hub_style_rows_take_tag_names_from_the_features(tmp_path):
    import datasets

    features = datasets.Features({"tokens": datasets.Sequence(datasets.Value("string")),
                                  "ner_tags": datasets.Sequence(datasets.ClassLabel(names=["O", "B-PER", "I-PER"]))})
    rows = {"tokens": [["Anna", "Petrova", "smiled"], ["hello"]] * 4, "ner_tags": [[1, 2, 0], [0]] * 4}
    (tmp_path / "hub").mkdir()
    datasets.Dataset.from_dict(rows, features=features).to_parquet(str(tmp_path / "hub/train.parquet"))
    dm = TokenClassificationData(dataset=str(tmp_path / "hub"), train="train")
    assert dm.raw("train")["tags"][0] == ["B-PER", "I-PER", "O"]
    assert dm.label_names == ["O", "B-PER", "I-PER"]


# -- the task through the CLI ----------------------------------------------------------------------


def ner_cli_args(ner_files, tmp_path) -> list[str]:
    return single_task([
        "--model=trunk.tasks.TokenClassification", "--model.trunk.d_model=32", "--model.trunk.n_layers=2",
        "--model.trunk.n_heads=4", "--model.trunk.d_ff=64", "--model.trunk.max_len=64", "--model.optimizer.lr=3e-3",
        "--data=trunk.datamodules.TokenClassificationData", f"--data.train={ner_files['train']}",
        f"--data.validation={ner_files['validation']}", f"--data.test={ner_files['test']}",
        f"--data.predict={ner_files['test']}", "--data.tokenizer_vocab_size=200", "--data.max_length=64",
        "--data.batch_size=16", "--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.max_epochs=6",
        "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
        f"--trainer.default_root_dir={tmp_path / 'run'}", "--seed_everything=0",
    ], "ner")


def test_fit_test_predict_through_the_cli(ner_files, tmp_path):
    cli = run_cli(["fit", *ner_cli_args(ner_files, tmp_path)])
    metrics = cli.trainer.callback_metrics  # after fit, the CLI tests the best checkpoint
    assert {f"test/ner/{k}" for k in ("f1", "precision", "recall", "f1_PER", "f1_LOC", "acc")} <= metrics.keys()
    assert metrics["test/ner/f1"] > 0.5  # the generated names are easy: it learns them in a few epochs
    logged = (Path(cli.trainer.logger.log_dir) / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {f"val/ner/{k}" for k in ("f1", "precision", "recall", "f1_ORG", "acc")} <= set(logged)
    ckpt = cli.trainer.checkpoint_callback.best_model_path
    out = tmp_path / "predictions.jsonl"
    run_cli(["predict", *ner_cli_args(ner_files, tmp_path), f"--ckpt_path={ckpt}", f"--predictions.output={out}"])
    records = [json.loads(line) for line in out.read_text().splitlines()]
    gold = read_conll(ner_files["test"])
    assert len(records) == len(gold) and records[0]["words"] == gold["tokens"][0]
    for record in records:
        assert len(record["tags"]) == len(record["words"])
        for entity in record["entities"]:
            assert entity["text"] == " ".join(record["words"][entity["start"] : entity["end"] + 1])
            assert entity["type"] in {"PER", "LOC", "ORG"}
    predicted = {(i, e["type"], e["start"], e["end"]) for i, r in enumerate(records) for e in r["entities"]}
    true = {(i, *s) for i, tags in enumerate(gold["tags"]) for s in spans_from_tags(tags)}
    assert len(predicted & true) / len(true) > 0.5


def test_predict_from_a_words_only_file(ner_files, tmp_path):
    args = [*ner_cli_args(ner_files, tmp_path), "--trainer.max_epochs=1"]
    cli = run_cli(["fit", *args])
    words_only = tmp_path / "words.txt"
    words_only.write_text("Anna\nvisited\nOslo\n\nHooli\nleft\n")
    out = tmp_path / "words.jsonl"
    run_cli(
        [
            "predict",
            *[a for a in args if not a.startswith("--data.tasks.ner.predict")],
            f"--data.tasks.ner.predict={words_only}",
            f"--ckpt_path={cli.trainer.checkpoint_callback.best_model_path}",
            f"--predictions.output={out}",
        ]
    )
    assert [json.loads(line)["words"] for line in out.read_text().splitlines()] == [
        ["Anna", "visited", "Oslo"],
        ["Hooli", "left"],
    ]
    # one sentence per line, as every other kind's .txt predict file: each line tagged as predict tags the string
    sentences = tmp_path / "sentences.txt"
    sentences.write_text("Anna visited Oslo\nHooli left\n")
    run_cli(["predict", *[a for a in args if not a.startswith("--data.tasks.ner.predict")],
             f"--data.tasks.ner.predict={sentences}", f"--ckpt_path={cli.trainer.checkpoint_callback.best_model_path}",
             f"--predictions.output={tmp_path / 'sentences.jsonl'}"])
    records = [json.loads(line) for line in (tmp_path / "sentences.jsonl").read_text().splitlines()]
    assert [r["words"] for r in records] == [["Anna", "visited", "Oslo"], ["Hooli", "left"]]
    direct = load(cli.trainer.checkpoint_callback.best_model_path).predict(["Anna visited Oslo", "Hooli left"])
    assert [r["tags"] for r in records] == [r["tags"] for r in direct]


@pytest.mark.parametrize("text, words, tags", [
    ("EU B-ORG\nrejects O\n\nPeter B-PER\n", [["EU", "rejects"], ["Peter"]], [["B-ORG", "O"], ["B-PER"]]),
    ("EU B-ORG\nrejects O\n", [["EU", "rejects"]], [["B-ORG", "O"]]),  # one sentence, tagged: columns
    ("EU\nrejects\n\nPeter\n", [["EU", "rejects"], ["Peter"]], None),  # words only
    ("-DOCSTART-\n\nEU NNP B-ORG\nrejects VBZ O\n", [["EU", "rejects"]], [["B-ORG", "O"]]),  # a DOCSTART line
    ("EU rejects German call\nPeter left\n", [["EU", "rejects", "German", "call"], ["Peter", "left"]], None),
    ("EU rejects call\n\nPeter left now\n", [["EU", "rejects", "call"], ["Peter", "left", "now"]], None),  # no tags
])
def test_a_plain_text_file_to_tag_is_read_as_columns_or_as_one_sentence_per_line(text, words, tags, tmp_path):
    from trunk.datamodules.sources import read_words

    path = tmp_path / "input.txt"
    path.write_text(text)
    ds = read_words(path, role="data.predict")
    assert ds["tokens"] == words
    assert ds["tags"] == (tags or [None] * len(words))


def test_fine_tunes_from_a_pretrained_trunk_with_freezing(ner_files, tmp_path):
    from trunk.core.codec import Codec
    from trunk.formats.trunk_dir import PretrainedTrunk, load_pretrained, save_pretrained
    from trunk.models import TrunkConfig, build_trunk

    tokenizer = train_wordpiece(
        (" ".join(s) for s in read_conll(ner_files["train"])["tokens"]), vocab_size=200, lowercase=False
    )
    config = TrunkConfig(vocab_size=tokenizer.get_vocab_size(), d_model=32, n_layers=2, n_heads=4, d_ff=64, max_len=64)
    trunk = PretrainedTrunk(tmp_path, config, {"text": {}}, build_trunk(config).state_dict(), codec=Codec(tokenizer))
    trunk_dir = save_pretrained(tmp_path / "trunk", trunk)
    args = [a for a in ner_cli_args(ner_files, tmp_path) if not a.startswith(("--model.trunk", "--data.tokenizer"))]
    cli = run_cli(["fit", *args, f"--model.init_from={trunk_dir}", "--model.finetune.freeze_embeddings=true",
                   "--model.finetune.freeze_layers=1", "--trainer.max_epochs=1"])
    pretrained = load_pretrained(trunk_dir).trunk_weights
    state = cli.model.trunk.state_dict()
    frozen = [k for k in state if k.startswith(("stems.", "backbone.blocks.0."))]
    assert frozen and all(torch.equal(state[k], pretrained[k]) for k in frozen)
    assert not torch.equal(state["backbone.blocks.1.ff.fc_in.weight"], pretrained["backbone.blocks.1.ff.fc_in.weight"])


def test_outside_weight_scales_the_loss_of_o_words():
    """The loss is cross-entropy weighted by label: O words count outside_weight, entity words 1 (a weighted mean)."""
    import torch.nn.functional as F

    from trunk.models import TrunkConfig
    from trunk.tasks import TokenClassification, TrunkModule

    tiny = TrunkConfig(
        vocab_size=40, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_len=16, dropout=0.0, attn_dropout=0.0
    )
    labels = ["O", "B-PER", "I-PER"]
    weighted = TrunkModule(
        {"t": TokenClassification(outside_weight=0.3)}, trunk=tiny, task_info={"t": {"label_names": labels}}
    )
    plain = TrunkModule({"t": TokenClassification()}, trunk=tiny, task_info={"t": {"label_names": labels}})
    plain.load_state_dict(weighted.state_dict())  # the weight is not stored: same weights, same logits
    weighted.eval(), plain.eval()  # no dropout between the calls
    torch.manual_seed(0)
    batch = {
        "task": "t",
        "input_ids": torch.randint(5, 40, (2, 6)),
        "attention_mask": torch.ones(2, 6, dtype=torch.long),
        "labels": torch.tensor([[-100, 0, 1, 2, 0, -100], [-100, 1, 0, 0, 0, -100]]),
    }
    logits = weighted.objectives["t"](weighted.trunk, batch).float().flatten(0, 1)
    gold = batch["labels"].flatten()
    real = gold != -100
    nll = F.cross_entropy(logits[real], gold[real], reduction="none")
    w = torch.where(gold[real] == 0, 0.3, 1.0)
    assert weighted.objectives["t"].loss(weighted.trunk, batch, "train").item() == pytest.approx(
        ((w * nll).sum() / w.sum()).item(), rel=1e-5
    )
    assert plain.objectives["t"].loss(plain.trunk, batch, "train").item() == pytest.approx(nll.mean().item(), rel=1e-5)
    with pytest.raises(ValueError, match=r"outside_weight must be in \(0, 1\]"):
        TokenClassification(outside_weight=0.0)
