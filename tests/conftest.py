"""Test isolation: no network, no W&B account, caches in temporary directories."""

import atexit
import os
import shutil
import sys
import tempfile

_TMP = tempfile.mkdtemp(prefix="trunk-tests-")
atexit.register(shutil.rmtree, _TMP, ignore_errors=True)  # each pytest process (xdist worker) removes its own
# Set before datasets / wandb are imported anywhere: both read these at import time.
os.environ.update(
    HF_HUB_OFFLINE="1",
    HF_DATASETS_OFFLINE="1",
    HF_DATASETS_CACHE=os.path.join(_TMP, "hf-datasets"),
    WANDB_MODE="offline",
    WANDB_DIR=os.path.join(_TMP, "wandb"),
    WANDB_CACHE_DIR=os.path.join(_TMP, "wandb-cache"),
    WANDB_CONFIG_DIR=os.path.join(_TMP, "wandb-config"),
    WANDB_SILENT="true",
    TRUNK_CACHE=os.path.join(_TMP, "trunk-cache"),
    # inference's precision=auto by the rule, not timed: a timing between near-equal forms of a tiny model would pick
    # one or another from run to run (tests/inference/test_quantize.py times them with it on)
    TRUNK_CALIBRATE="0",
)
os.environ.pop("WANDB_API_KEY", None)
# the processes tests start skip torchmetrics' imports of the dev extras (tests/site/sitecustomize.py says why)
os.environ["PYTHONPATH"] = os.pathsep.join(
    filter(None, [os.path.join(os.path.dirname(os.path.abspath(__file__)), "site"), os.environ.get("PYTHONPATH")]))
# tests run two at a time (make test): one thread each, in their subprocesses too
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"

import csv  # noqa: E402
import gzip  # noqa: E402
import random  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from trunk.datamodules.builtin import sentiment_example  # noqa: E402

REPO = Path(__file__).resolve().parent.parent

try:  # the fuzz tests: the same examples on every run (HYPOTHESIS_PROFILE=explore draws new ones, more of them)
    from hypothesis import HealthCheck, settings

    settings.register_profile("ci", derandomize=True, deadline=None, max_examples=100, print_blob=True,
                              suppress_health_check=[HealthCheck.too_slow])
    settings.register_profile("explore", deadline=None, max_examples=2000)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
except ImportError:
    pass


def logged_metrics(folder: Path) -> dict[str, float]:
    """What a run logged, whole (its newest metrics.csv under ``folder``): each metric's last value. The printed
    tables round to 4 places."""
    newest = max(folder.rglob("metrics.csv"), key=lambda path: path.stat().st_mtime)
    values: dict[str, float] = {}
    with newest.open() as f:
        for row in csv.DictReader(f):
            values.update({key: float(value) for key, value in row.items() if value not in ("", None)})
    return values


def write_rows(path: Path, rows: list[dict]) -> Path:
    """Write rows as csv / tsv / jsonl, chosen by the file suffix."""
    if path.suffix == ".jsonl":
        import json

        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]), delimiter="\t" if path.suffix == ".tsv" else ",")
            writer.writeheader()
            writer.writerows(rows)
    return path


@pytest.fixture
def sentiment_files(tmp_path: Path) -> dict[str, Path]:
    """Small train / validation / test csv files of generated sentiment sentences."""
    rng = random.Random(0)
    sizes = {"train": 256, "validation": 64, "test": 64}
    return {
        split: write_rows(tmp_path / f"{split}.csv", [sentiment_example(rng) for _ in range(n)])
        for split, n in sizes.items()
    }


RUN_OPTIONS = {
    "model": ("trunk", "optimizer", "finetune", "init_from", "task_weights", "reinit_mismatched_heads"),
    "data": (
        "tokenizer",
        "tokenizer_vocab_size",
        "lowercase",
        "sampling",
        "temperature",
        "weights",
        "anneal_to",
        "steps_per_epoch",
        "seed",
        "predict_task",
    ),
}


def single_task(args: list[str], task: str = "sentiment") -> list[str]:
    """Write one task's options in the CLI's layout: ``--model=<objective>`` becomes
    ``--model.tasks.<task>=<objective>``, ``--data.train=x`` becomes ``--data.tasks.<task>.train=x``;
    options of the whole run (trunk, optimizer, tokenizer, sampling, ...) stay where they are."""
    out = []
    for arg in args:
        for side in ("model", "data"):
            if arg.startswith(f"--{side}="):
                arg = f"--{side}.tasks.{task}={arg.split('=', 1)[1]}"
            elif arg.startswith(f"--{side}.") and not arg.startswith(f"--{side}.tasks."):
                key = arg[len(f"--{side}."):].split("=")[0].split(".")[0]
                if key not in RUN_OPTIONS[side]:
                    arg = f"--{side}.tasks.{task}.{arg[len(f'--{side}.'):]}"
        out.append(arg)
    return out


TINY_MODEL = [
    "--model=trunk.tasks.SequenceClassification",
    "--model.trunk.d_model=32",
    "--model.trunk.n_layers=2",
    "--model.trunk.n_heads=4",
    "--model.trunk.d_ff=64",
    "--model.trunk.max_len=64",
]


@pytest.fixture
def tiny_cli_args(sentiment_files, tmp_path: Path) -> list[str]:
    """CLI arguments for a tiny, fast classification run (task "sentiment") in tmp_path (no subcommand)."""
    return single_task([
        *TINY_MODEL,
        "--data=trunk.datamodules.TextClassificationData",
        f"--data.train={sentiment_files['train']}",
        f"--data.validation={sentiment_files['validation']}",
        f"--data.test={sentiment_files['test']}",
        f"--data.predict={sentiment_files['test']}",
        "--data.tokenizer_vocab_size=300",
        "--data.max_length=64",
        "--data.batch_size=32",
        "--trainer.accelerator=cpu",
        "--trainer.devices=1",
        "--trainer.max_epochs=1",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        f"--trainer.default_root_dir={tmp_path / 'run'}",
        "--seed_everything=0",
    ])


FIRST_NAMES = ["Anna", "Boris", "Carla", "Dmitri", "Elena", "Farid", "Greta", "Hiroshi", "Ines", "Jonas"]
SURNAMES = ["Kowalski", "Lindqvist", "Moreau", "Nakamura", "Okafor", "Petrova", "Quispe", "Rossi"]
CITIES = [["Paris"], ["New", "York"], ["Lagos"], ["Buenos", "Aires"], ["Oslo"], ["Kyoto"]]
COMPANIES = [["Acme", "Corp"], ["Globex"], ["Initech"], ["Umbrella", "Group"], ["Hooli"]]
FILLERS = ["said", "on", "Monday", "that", "the", "deal", "was", "good", "and", "then", "left", "."]


def ner_sentence(rng: random.Random) -> list[tuple[str, str]]:
    """One generated sentence as (word, IOB2 tag) pairs: people, places and companies among filler words."""
    def entity(words: list[str], entity_type: str) -> list[tuple[str, str]]:
        return [(w, ("B-" if i == 0 else "I-") + entity_type) for i, w in enumerate(words)]

    person = [rng.choice(FIRST_NAMES)] + ([rng.choice(SURNAMES)] if rng.random() < 0.6 else [])
    parts = [entity(person, "PER"), [("visited", "O")], entity(rng.choice(CITIES), "LOC")]
    if rng.random() < 0.5:
        parts += [[("for", "O")], entity(rng.choice(COMPANIES), "ORG")]
    parts.append([(w, "O") for w in rng.sample(FILLERS, rng.randint(1, 4))])
    rng.shuffle(parts)
    return [pair for part in parts for pair in part]


def write_conll(path: Path, sentences: list[list[tuple[str, str]]]) -> Path:
    """CoNLL-2003 layout: -DOCSTART-, then `WORD POS CHUNK TAG` lines, a blank line after each sentence."""
    lines = ["-DOCSTART- -X- -X- O", ""]
    for sentence in sentences:
        lines += [f"{word} NN O {tag}" for word, tag in sentence] + [""]
    path.write_text("\n".join(lines) + "\n")
    return path


SCORED_WORDS = {
    "superb": 2.0,
    "great": 1.5,
    "good": 1.0,
    "fine": 0.5,
    "plain": 0.0,
    "dull": -0.5,
    "bad": -1.0,
    "awful": -2.0,
}
FILLER_WORDS = ["the", "film", "plot", "was", "and", "acting", "music", "very"]


def scored_pair(rng: random.Random) -> dict:
    """A text pair with two real-valued targets a model can learn exactly: ``score``, a linear function of
    the one scored word on each side (2.5 + the first's value - half the second's), and ``length``, the
    number of words in both."""
    def side() -> tuple[list[str], float]:
        scored = rng.choice(list(SCORED_WORDS))
        words = [scored, *rng.sample(FILLER_WORDS, rng.randint(1, 3))]
        rng.shuffle(words)
        return words, SCORED_WORDS[scored]

    (first, a), (second, b) = side(), side()
    return {
        "text": " ".join(first),
        "pair": " ".join(second),
        "score": 2.5 + a - 0.5 * b,
        "length": len(first) + len(second),
    }


@pytest.fixture
def scores_files(tmp_path: Path) -> dict[str, Path]:
    """Small train / validation / test tsv files of text pairs with two real-valued targets (``scored_pair``)."""
    rng = random.Random(0)
    sizes = {"train": 400, "validation": 64, "test": 64}
    return {
        split: write_rows(tmp_path / f"scores_{split}.tsv", [scored_pair(rng) for _ in range(n)])
        for split, n in sizes.items()
    }


TOPIC_WORDS = {"animal": ["dog", "cat", "horse", "owl"], "food": ["bread", "apple", "soup", "cheese"],
               "sport": ["tennis", "football", "golf", "rowing"], "weather": ["rain", "snow", "wind", "sunshine"]}


def tagged_text(rng: random.Random) -> dict:
    """A text about 0-3 topics (a word of each among fillers) and its topics, comma-separated (the label set)."""
    topics = sorted(rng.sample(list(TOPIC_WORDS), rng.choice([0, 1, 1, 2, 2, 3])))
    words = [rng.choice(TOPIC_WORDS[t]) for t in topics] + rng.sample(FILLER_WORDS, rng.randint(1, 4))
    rng.shuffle(words)
    return {"text": " ".join(words), "labels": ",".join(topics)}


@pytest.fixture
def topics_files(tmp_path: Path) -> dict[str, Path]:
    """Small train / validation / test csv files of texts with a set of topics each (``tagged_text``)."""
    rng = random.Random(0)
    sizes = {"train": 400, "validation": 64, "test": 64}
    return {
        split: write_rows(tmp_path / f"topics_{split}.csv", [tagged_text(rng) for _ in range(n)])
        for split, n in sizes.items()
    }


def quiz_question(rng: random.Random) -> dict:
    """"Which of these is a kind of <topic>?" with 3 or 4 candidates, one of that topic; the answer as a letter."""
    topic = rng.choice(list(TOPIC_WORDS))
    others = [
        rng.choice(TOPIC_WORDS[t]) for t in rng.sample([t for t in TOPIC_WORDS if t != topic], rng.choice([2, 3]))
    ]
    choices = [rng.choice(TOPIC_WORDS[topic]), *others]
    rng.shuffle(choices)
    answer = next(i for i, c in enumerate(choices) if c in TOPIC_WORDS[topic])
    return {"question": f"which of these is about {topic} ?", "choices": choices, "answer": "ABCD"[answer]}


@pytest.fixture
def quiz_files(tmp_path: Path) -> dict[str, Path]:
    """Small train / validation / test jsonl files of multiple-choice questions (``quiz_question``)."""
    rng = random.Random(0)
    sizes = {"train": 600, "validation": 48, "test": 48}
    return {
        split: write_rows(tmp_path / f"quiz_{split}.jsonl", [quiz_question(rng) for _ in range(n)])
        for split, n in sizes.items()
    }


QA_FACTS = {  # relation -> (the fact's words, the question's words, the answers it draws from)
    "lives": ("lives in", "where does {} live ?", [" ".join(c) for c in CITIES]),
    "works": ("works at", "where does {} work ?", [" ".join(c) for c in COMPANIES]),
    "left": ("left on", "when did {} leave ?", ["Monday", "Tuesday", "Friday", "Sunday"]),
    "bought": ("bought a", "what did {} buy ?", ["red car", "small boat", "new phone", "blue kite"]),
}


def squad_article(rng: random.Random, n_paragraphs: int = 4) -> dict:
    """A SQuAD-format article: paragraphs of four facts about people among filler words ("Anna lives in Oslo .
    Boris left on Friday . ..."), one question per fact whose answer is a span, with its character offset."""
    paragraphs = []
    for _ in range(n_paragraphs):
        context, qas = "", []
        for person, (words, question, answers) in zip(
            rng.sample(FIRST_NAMES, 4), rng.sample(list(QA_FACTS.values()), 4)
        ):
            answer = rng.choice(answers)
            context += " ".join(rng.sample(FILLERS, 3)) + f" . {person} {words} "
            qas.append({"id": f"q{rng.getrandbits(40)}", "question": question.format(person),
                        "answers": [{"text": answer, "answer_start": len(context)}]})
            context += f"{answer} . "
        paragraphs.append({"context": context.strip(), "qas": qas})
    return {"title": f"article {rng.getrandbits(20)}", "paragraphs": paragraphs}


@pytest.fixture
def squad_files(tmp_path: Path) -> dict[str, Path]:
    """Small train / validation / test files in SQuAD's JSON format (``squad_article``)."""
    import json

    rng = random.Random(0)
    files = {}
    for split, n in {"train": 40, "validation": 6, "test": 6}.items():
        files[split] = tmp_path / f"squad_{split}.json"
        files[split].write_text(json.dumps({"version": "1.1", "data": [squad_article(rng) for _ in range(n)]}))
    return files


@pytest.fixture
def ner_files(tmp_path: Path) -> dict[str, Path]:
    rng = random.Random(0)
    sizes = {"train": 200, "validation": 40, "test": 40}
    return {
        split: write_conll(tmp_path / f"ner_{split}.txt", [ner_sentence(rng) for _ in range(n)])
        for split, n in sizes.items()
    }


def reversal_pairs(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """A toy 'language pair': the target is the source's words reversed, capitalised, with a full stop."""
    rng = random.Random(seed)
    words = ["apple", "bird", "cat", "dog", "egg", "fish", "goat", "hat"]
    pairs = []
    for _ in range(n):
        sentence = rng.choices(words, k=rng.randint(2, 5))
        pairs.append((" ".join(sentence), " ".join(reversed(sentence)).capitalize() + "."))
    return pairs


def write_parallel(directory: Path, split: str, pairs: list[tuple[str, str]], gz: bool = False) -> str:
    """Files <split>.src / <split>.tgt (plain or gzip); returns the {lang} template."""
    suffix = ".gz" if gz else ""
    for lang, side in (("src", 0), ("tgt", 1)):
        text = "".join(pair[side] + "\n" for pair in pairs)
        path = directory / f"{split}.{lang}{suffix}"
        if gz:
            with gzip.open(path, "wt", encoding="utf-8") as f:
                f.write(text)
        else:
            path.write_text(text, encoding="utf-8")
    return str(directory / f"{split}.{{lang}}{suffix}")


@pytest.fixture
def reversal_files(tmp_path: Path) -> dict[str, str]:
    """Parallel files (train gzipped) of a task small enough to learn exactly in seconds."""
    sizes = {"train": 1500, "validation": 60, "test": 60}
    return {split: write_parallel(tmp_path, split, reversal_pairs(n, seed=i), gz=split == "train")
            for i, (split, n) in enumerate(sizes.items())}


def standalone(member, name: str = "ner", **options):
    """One task's data on its own, with the run's tokenizer connected (``options``: MultiTaskData's, e.g.
    tokenizer or tokenizer_vocab_size), as a run would hand it."""
    from trunk.datamodules import MultiTaskData

    MultiTaskData({name: member}, **options).tokenizer  # noqa: B018 (loads or trains it, and connects it)
    return member


@pytest.fixture(autouse=True)
def fresh_wandb():
    """W&B keeps its settings (a run's folder among them) for the next run of the process: each test starts clean."""
    yield
    if "wandb" in sys.modules:
        import wandb

        if wandb.run is not None:
            wandb.finish()
        wandb.teardown()


@pytest.fixture
def tiny_trunk_dir(sentiment_files, tmp_path) -> Path:
    """A small pretrained-trunk directory for recipes that fine-tune (model.init_from)."""
    import csv

    from trunk.core.codec import Codec
    from trunk.datamodules.tokenizer import train_wordpiece
    from trunk.formats.trunk_dir import PretrainedTrunk, save_pretrained
    from trunk.models import TrunkConfig, build_trunk

    with sentiment_files["train"].open() as f:
        tokenizer = train_wordpiece([row["text"] for row in csv.DictReader(f)], vocab_size=300)
    config = TrunkConfig(vocab_size=tokenizer.get_vocab_size(), d_model=32, n_layers=2, n_heads=4, d_ff=64, max_len=128,
                         positions="rope")
    trunk = build_trunk(config)
    return save_pretrained(
        tmp_path / "trunk", PretrainedTrunk(tmp_path, config, {"text": {}}, trunk.state_dict(), codec=Codec(tokenizer))
    )


@pytest.fixture
def timed(monkeypatch, tmp_path):
    """precision=auto timed, in a cache of this test's own, on a CPU with bf16 and int8 units; ``timed.seconds``
    stands in for the measurement (None: measure for real), ``timed.calls`` counts the measurements."""
    from trunk.inference import calibrate

    monkeypatch.setenv("TRUNK_CALIBRATE", "1")
    monkeypatch.setenv("TRUNK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(calibrate, "cpu_bf16_is_native", lambda: (True, "test"))
    monkeypatch.setattr(calibrate, "int8_is_native", lambda: (True, "test"))
    state = type("Timed", (), {"seconds": None, "calls": 0, "path": tmp_path / "cache" / "calibration" /
                                "calibration.json"})()
    real = calibrate.measure

    def measure(cfg, forms):
        state.calls += 1
        return real(cfg, forms) if state.seconds is None else {form: state.seconds[form] for form in forms}

    monkeypatch.setattr(calibrate, "measure", measure)
    return state
