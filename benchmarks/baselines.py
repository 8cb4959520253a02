"""Cheap classic baselines for a recipe's tasks, on the same splits Trunk reads: prints a table.

    python benchmarks/baselines.py --config configs/sick.yaml [--config more.yaml] [--split test]

Each task's data is built from the config exactly as `trunk fit` builds it (files, columns, select,
label names), then scored with scikit-learn (`pip install trunk[bench]`):
  * classification: the majority class; TF-IDF (word 1-2 grams) + logistic regression.
  * regression (pairs): the TF-IDF cosine of the two texts, fitted to the scores by a linear map
    (Pearson is blind to it); TF-IDF features of both sides (product and difference) + ridge regression.
  * multi-label: every training label above the threshold's share predicted for every row (the label
    prior); TF-IDF + one logistic regression per label, at the recipe's threshold.
  * multiple choice: the most common answer position; the candidate with the highest TF-IDF cosine to
    the context.
  * token classification (NER): every word labelled as its most common training tag (a memorised gazetteer);
    logistic regression per word on its form, shape, affixes and neighbours (a linear tagger), entity F1.
  * extractive QA: the context sentence with the highest TF-IDF cosine to the question, whole or without the
    question's words (SQuAD's exact match and F1).
"""

from __future__ import annotations

import argparse
import importlib
import math
from pathlib import Path

import numpy as np
import yaml

from trunk.datamodules.sources import column


def task_data(configs: list[str]) -> tuple[dict, dict]:
    """Each task's data object and objective options, from the recipe(s) (later files override earlier ones)."""
    data, model = {}, {}
    for path in configs:
        recipe = yaml.safe_load(Path(path).read_text())
        for name, spec in recipe.get("data", {}).get("tasks", {}).items():
            data[name] = spec
        for name, spec in recipe.get("model", {}).get("tasks", {}).items():
            model[name] = spec.get("init_args") or {}
    members = {}
    for name, spec in data.items():
        module, _, cls = spec["class_path"].rpartition(".")
        member = getattr(importlib.import_module(module), cls)(**(spec.get("init_args") or {}))
        member.name = name
        members[name] = member
    return members, model


def tfidf():
    from sklearn.feature_extraction.text import TfidfVectorizer

    return TfidfVectorizer(ngram_range=(1, 2), min_df=1, sublinear_tf=True)


def classification(member, split: str, options: dict) -> dict:
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import f1_score, matthews_corrcoef

    train, test = member.raw("train"), member.raw(split)
    texts = lambda ds: [" ".join(map(str, row)) for row in zip(*(column(ds, c) for c in member.tokenizer_columns()))]  # noqa: E731
    y_train, y_test = member.targets(train, "train"), member.targets(test, split)
    majority = np.full(len(y_test), np.bincount(y_train).argmax())
    vectorizer = tfidf()
    model = LogisticRegression(max_iter=2000, C=10.0).fit(vectorizer.fit_transform(texts(train)), y_train)
    predicted = model.predict(vectorizer.transform(texts(test)))
    row = lambda p: {"acc": float(np.mean(p == np.array(y_test))), "f1_macro": f1_score(y_test, p, average="macro"),  # noqa: E731
                     "mcc": matthews_corrcoef(y_test, p)}
    return {"majority class": row(majority), "TF-IDF + logistic regression": row(predicted)}


def regression(member, split: str, options: dict) -> dict:
    from scipy.stats import pearsonr, spearmanr
    from sklearn.linear_model import Ridge

    if member.text_pair_column is None:
        raise SystemExit("The regression baselines compare the two texts of a pair; this task has one text.")
    train, test = member.raw("train"), member.raw(split)
    y_train, y_test = (np.array(member.targets(ds, role))[:, 0] for ds, role in ((train, "train"), (test, split)))
    vectorizer = tfidf().fit(column(train, member.text_column) + column(train, member.text_pair_column))

    def sides(ds):
        return vectorizer.transform(column(ds, member.text_column)), vectorizer.transform(
            column(ds, member.text_pair_column)
        )

    def cosine(ds):
        a, b = sides(ds)
        return np.asarray(a.multiply(b).sum(1)).ravel()  # rows are L2-normalised

    def features(ds):
        from scipy.sparse import hstack

        a, b = sides(ds)
        return hstack([a.multiply(b), abs(a - b)]).tocsr()

    linear = np.polyfit(cosine(train), y_train, 1)
    by_cosine = np.polyval(linear, cosine(test))
    ridge = Ridge(alpha=1.0).fit(features(train), y_train).predict(features(test))
    row = lambda p: {"pearson": pearsonr(p, y_test)[0], "spearman": spearmanr(p, y_test)[0],  # noqa: E731
                     "mse": float(np.mean((p - y_test) ** 2))}
    return {"TF-IDF cosine of the two texts": row(by_cosine), "TF-IDF product and difference + ridge": row(ridge)}


def multi_label(member, split: str, options: dict) -> dict:
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import f1_score
    from sklearn.multiclass import OneVsRestClassifier

    threshold = options.get("threshold", 0.5)
    train, test = member.raw("train"), member.raw(split)
    y_train, y_test = np.array(member.targets(train, "train")), np.array(member.targets(test, split))
    prior = np.tile(y_train.mean(0) >= threshold, (len(y_test), 1)).astype(int)
    if not prior.any():  # no label is that common: the most common one for every row
        prior[:, y_train.sum(0).argmax()] = 1
    vectorizer = tfidf()
    model = OneVsRestClassifier(LogisticRegression(max_iter=2000, C=10.0)).fit(
        vectorizer.fit_transform(column(train, member.text_column)), y_train
    )
    predicted = (model.predict_proba(vectorizer.transform(column(test, member.text_column))) >= threshold).astype(int)
    row = lambda p: {"f1_micro": f1_score(y_test, p, average="micro", zero_division=0),  # noqa: E731
                     "f1_macro": f1_score(y_test, p, average="macro", zero_division=0),
                     "exact_match": float(np.mean((p == y_test).all(1)))}
    return {
        "label prior (the most common labels for every row)": row(prior),
        f"TF-IDF + logistic regression per label (threshold {threshold})": row(predicted),
    }


def multiple_choice(member, split: str, options: dict) -> dict:
    train, test = member.raw("train"), member.raw(split)
    train_rows, test_rows = member.candidates(train, "train"), member.candidates(test, split)
    y_train, y_test = (
        np.array(member.answers(train, "train", train_rows)),
        np.array(member.answers(test, split, test_rows)),
    )
    position = np.bincount(y_train).argmax()
    contexts = column(test, member.context_column)
    vectorizer = tfidf().fit(column(train, member.context_column) + [c for texts, _ in train_rows for c in texts])
    picked = []
    for context, (texts, _) in zip(contexts, test_rows):
        vectors = vectorizer.transform([context, *texts])
        picked.append(int(np.argmax((vectors[1:] @ vectors[0].T).toarray().ravel())))
    return {f"most common answer position ({'ABCDEFGH'[position]})": {"acc": float(np.mean(y_test == position))},
            "the candidate closest to the context (TF-IDF cosine)": {"acc": float(np.mean(np.array(picked) == y_test))}}


def question_answering(member, split: str, options: dict) -> dict:
    """The context sentence closest to the question (TF-IDF cosine), whole or without the question's words (answers
    rarely repeat them): a sentence-retrieval baseline in the spirit of SQuAD's sliding window."""
    import re

    from trunk.tasks.objectives.question_answering import best_scores, normalize_answer

    train, test = member.raw("train"), member.raw(split)
    vectorizer = tfidf().fit(column(train, member.context_column) + column(train, member.question_column))
    scores = {"sentence": [], "sentence, less the question's words,": []}
    for question, context, answers in zip(column(test, member.question_column), column(test, member.context_column),
                                          column(test, member.answers_column)):
        sentences = [s for s in re.split(r"(?<=[.!?])\s+", context) if s.strip()] or [context]
        vectors = vectorizer.transform([question, *sentences])
        sentence = sentences[int(np.argmax((vectors[1:] @ vectors[0].T).toarray().ravel()))]
        asked = set(normalize_answer(question).split())
        rest = " ".join(w for w in sentence.split() if normalize_answer(w) not in asked)
        golds = list(answers["text"]) if isinstance(answers, dict) else [a["text"] for a in answers]
        scores["sentence"].append(best_scores(sentence, golds))
        scores["sentence, less the question's words,"].append(best_scores(rest, golds))
    return {
        f"the {name} closest to the question (TF-IDF cosine)": {
            "exact_match": float(np.mean([em for em, _ in rows])),
            "f1": float(np.mean([f1 for _, f1 in rows])),
        }
        for name, rows in scores.items()
    }


def word_features(words: list[str], i: int) -> dict:
    """A linear tagger's view of one word: itself, its shape and affixes, and its neighbours (as in classic NER)."""
    word = words[i]
    shape = "".join("X" if c.isupper() else "x" if c.islower() else "d" if c.isdigit() else c for c in word)
    features = {
        "w=" + word.lower(): 1,
        "shape=" + shape[:6]: 1,
        "pre=" + word[:3].lower(): 1,
        "suf=" + word[-3:].lower(): 1,
        "title": word.istitle(),
        "upper": word.isupper(),
        "first": i == 0,
        "#@": word[:1] in "#@",
    }
    for offset in (-2, -1, 1, 2):
        j = i + offset
        features[f"w{offset:+d}=" + (words[j].lower() if 0 <= j < len(words) else "<pad>")] = 1
        if 0 <= j < len(words):
            features[f"title{offset:+d}"] = words[j].istitle()
    return features


def token_classification(member, split: str, options: dict) -> dict:
    from sklearn.feature_extraction import DictVectorizer
    from sklearn.linear_model import LogisticRegression

    from trunk.tasks.objectives.token_classification import EntityF1

    train, test = member.raw("train"), member.raw(split)
    train_words, train_tags = column(train, "tokens"), column(train, "tags")
    test_words, test_tags = column(test, "tokens"), column(test, "tags")
    counts = {}
    for words, tags in zip(train_words, train_tags):
        for word, tag in zip(words, tags):
            counts.setdefault(word, {}).setdefault(tag, 0)
            counts[word][tag] += 1
    memorised = [[max(counts[w], key=counts[w].get) if w in counts else "O" for w in words] for words in test_words]
    vectorizer = DictVectorizer()
    x_train = vectorizer.fit_transform([word_features(words, i) for words in train_words for i in range(len(words))])
    model = LogisticRegression(max_iter=1000, C=1.0).fit(x_train, [t for tags in train_tags for t in tags])
    flat = model.predict(
        vectorizer.transform([word_features(words, i) for words in test_words for i in range(len(words))])
    )
    predicted, start = [], 0
    for words in test_words:
        predicted.append(list(flat[start:start + len(words)]))
        start += len(words)
    types = sorted({tag.split("-", 1)[1] for tag in member.label_names if "-" in tag})

    def row(tags):
        metric = EntityF1(types)
        metric.update(tags, test_tags)
        scores = metric.compute()
        return {name: float(scores[name]) for name in ("f1", "precision", "recall")}

    return {
        "each word's most common training tag": row(memorised),
        "logistic regression on word features": row(predicted),
    }


BASELINES = {
    "sequence_classification": classification,
    "token_classification": token_classification,
    "sequence_regression": regression,
    "multi_label_classification": multi_label,
    "multiple_choice": multiple_choice,
    "extractive_qa": question_answering,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", action="append", required=True, help="a recipe (repeat to merge several)")
    parser.add_argument("--split", default="test", choices=["validation", "test"])
    args = parser.parse_args()
    members, options = task_data(args.config)
    for name, member in members.items():
        kind = member.kinds[0]
        if kind not in BASELINES:
            print(f"{name}: no baseline for {kind}")
            continue
        results = BASELINES[kind](member, args.split, options.get(name, {}))
        metrics = list(next(iter(results.values())))
        print(f"\n{name} ({kind}), {args.split} split, {len(member.raw(args.split))} rows\n")
        print("| baseline | " + " | ".join(metrics) + " |\n|---|" + "---|" * len(metrics))
        for baseline, values in results.items():
            print(
                f"| {baseline} | "
                + " | ".join("-" if math.isnan(values[m]) else f"{values[m]:.4f}" for m in metrics)
                + " |"
            )


if __name__ == "__main__":
    main()
