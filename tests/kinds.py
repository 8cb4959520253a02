"""The task kinds as the tests run them: for each kind of Trunk's registry (``trunk.tasks.registry.KINDS``, which pairs
its objective with its data class), small generated data (from conftest's fixtures) and options. A new task kind
gets an entry here; tests/tasks/test_matrix.py runs every kind through every path (and checks that every kind of the
registry is here), and tests/cli/test_cli.py points every recipe's tasks at these data."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from trunk.tasks import registry


@dataclass(frozen=True)
class Kind:
    splits: tuple[str, ...]  # what the data options give: train, validation, test, predict
    labels: tuple[str, ...] | None = None  # the label names the data should yield, in order
    inputs: tuple = ()  # raw inputs for trunk.tasks.load(...).predict; none: the kind is not predicted from raw inputs
    objective_args: tuple[str, ...] = ()
    extra: tuple[str, ...] = field(default=())
    recipe_resets: tuple[str, ...] = ()  # a recipe's own options these data do not fit (columns, label names)
    label_option: str = "label_names"  # the data option that names the labels (in the order the data carries them)
    onnx: bool = False  # `trunk export --onnx` writes its graph
    name: str = ""  # the kind's name in the registry (set below)

    @property
    def objective(self) -> str:
        """The objective's class path, as a config names it."""
        return f"trunk.tasks.{registry.KINDS[self.name].objective.__name__}"

    @property
    def data(self) -> str:
        """The data class's path, as a config names it."""
        return f"trunk.datamodules.{registry.KINDS[self.name].data.__name__}"

    def data_args(self, files: dict) -> list[str]:
        """``--data.*`` options (single-task layout, see conftest.single_task) pointing at small generated data."""
        source = DATA_FILES[self.data.rsplit(".", 1)[1]]
        if source is None:  # built in
            return [*self.extra, *(f"--data.{split}={split}" for split in self.splits)]
        return [
            *self.extra,
            *(f"--data.{split}={files[source][split if split != 'predict' else 'test']}" for split in self.splits),
        ]


def recipe_task_args(name: str, data_class: str, files: dict) -> tuple[list[str], list[str] | None]:
    """Options pointing one task of a recipe at small generated data, and the labels it should yield."""
    from conftest import single_task

    kind = next(k for k in KINDS.values() if k.data.rsplit(".", 1)[1] == data_class.rsplit(".", 1)[1])
    dataset = ["--data.dataset=null"] if DATA_FILES[kind.data.rsplit(".", 1)[1]] is not None else []
    return single_task([*dataset, *kind.recipe_resets, *kind.data_args(files)], name), list(
        kind.labels
    ) if kind.labels else None


# data class -> the conftest fixture ``<name>_files`` that generates its files (None: built-in data)
DATA_FILES = {"TextClassificationData": "sentiment", "CorpusData": "sentiment", "TokenClassificationData": "ner",
              "TranslationData": "reversal", "ImageClassificationData": None, "TextRegressionData": "scores",
              "MultiLabelTextData": "topics", "MultipleChoiceData": "quiz",
              "QuestionAnsweringData": "squad"}

KINDS = {
    "sequence_classification": Kind(
        ("train", "validation", "test", "predict"),
        labels=("negative", "positive"),
        inputs=("the film was great", "the plot was not good but the acting was superb"),
        # class weights: figures of the training split, which load() must not need
        objective_args=("--model.class_weights=balanced", "--model.label_smoothing=0.1"),
        recipe_resets=(
            "--data.text_column=text",
            "--data.label_column=label",
            "--data.label_names=null",
            "--data.line_pattern=null",
            "--data.encoding=utf-8",
            "--data.select=null",
            "--data.file_type=null",
            "--data.text_pair_column=null",
        ),
        onnx=True,
    ),
    "token_classification": Kind(
        ("train", "validation", "test", "predict"),
        labels=("O", "B-LOC", "I-LOC", "B-ORG", "I-ORG", "B-PER", "I-PER"),
        inputs=(["Anna", "Petrova", "said", "on", "Monday"], "Globex left Paris ."),
        onnx=True,
        objective_args=("--model.label_smoothing=0.1", "--model.trunk.local_window=3", "--model.trunk.global_tokens=2"),
    ),  # every path with local attention
    "masked_lm": Kind(
        ("train",),
        extra=("--data.text_column=text", "--data.val_fraction=0.1"),
        objective_args=("--model.label_smoothing=0.1",),
        recipe_resets=("--data.validation=null",),
    ),
    "replaced_token_detection": Kind(
        ("train",),
        extra=("--data.text_column=text", "--data.val_fraction=0.1"),
        recipe_resets=("--data.validation=null",),
    ),
    "translation": Kind(
        ("train", "validation", "test", "predict"),
        inputs=("cat dog egg", "bird hat"),
        objective_args=("--model.generation.beam_size=1",),
        extra=("--data.source_lang=src", "--data.target_lang=tgt"),
        recipe_resets=("--data.source_language=null",),  # a pretrained tokenizer's language code
    ),
    "image_classification": Kind(
        ("train", "validation", "test"),
        labels=("cross", "diagonal", "horizontal", "square", "vertical"),
        objective_args=("--model.image_size=16",),
        extra=("--data.dataset=trunk:shapes",),
    ),
    "sequence_regression": Kind(
        ("train", "validation", "test", "predict"),
        labels=("score", "length"),
        inputs=(("great film", "dull plot"), ("the plot was awful", "superb music")),
        objective_args=("--model.pooler=false",),  # every path (ONNX too) with a head that has no pooler
        extra=("--data.text_pair_column=pair", '--data.label_column=["score", "length"]'),
        label_option="label_column",
        recipe_resets=("--data.text_column=text", "--data.select=null", "--data.file_type=null"),
        onnx=True,
    ),
    "multi_label_classification": Kind(
        ("train", "validation", "test", "predict"),
        labels=("animal", "food", "sport", "weather"),
        inputs=("the dog ate bread in the rain", "golf was very good"),
        recipe_resets=(
            "--data.text_column=text",
            "--data.label_column=labels",
            "--data.label_names=null",
            "--data.column_names=null",
        ),
        objective_args=("--model.label_smoothing=0.1",),
        onnx=True,
    ),
    "multiple_choice": Kind(
        ("train", "validation", "test", "predict"),
        inputs=(
            {"context": "which of these is about food ?", "choices": ["owl", "soup", "golf"]},
            ("which is about sport ?", ["rain", "tennis"]),
        ),
        # smoothing over 2-3 candidates a row: the missing ones get none
        objective_args=("--model.label_smoothing=0.1", "--model.pooler=false"),
        recipe_resets=("--data.context_column=question", "--data.choices_column=choices", "--data.label_column=answer"),
    ),
    "extractive_qa": Kind(
        ("train", "validation", "test", "predict"),
        inputs=(
            {
                "question": "where does Anna live ?",
                "context": "the deal was good . Anna lives in New York . Boris works at Hooli .",
            },
            ("where does Boris work ?", "Boris works at Globex ."),
        ),
        objective_args=("--model.label_smoothing=0.1",),
        extra=("--data.max_length=48", "--data.doc_stride=8"),
        recipe_resets=("--data.val_fraction=0.0", "--data.hold_out_by=null"),
    ),
}
KINDS = {name: replace(kind, name=name) for name, kind in KINDS.items()}
