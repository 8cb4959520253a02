"""Property-based fuzzing of what ``trunk serve`` does with a request body (trunk/inference/serve.py), in process: any
JSON, any text, any bytes is either refused by the request model (FastAPI's 422), refused by the worker with a
sentence (422), or answered; nothing raises anything else. Derandomised (tests/conftest.py's profile "ci")."""

from __future__ import annotations

import json
import random

import pytest

pytest.importorskip("litserve")
hypothesis = pytest.importorskip("hypothesis")

from conftest import TINY_MODEL, sentiment_example, single_task, write_rows  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from pydantic import ValidationError  # noqa: E402

from trunk.cli import run_cli  # noqa: E402
from trunk.inference.serve import Limits, PredictRequest, Refused, TrunkAPI  # noqa: E402

TEXT = st.text(st.characters(exclude_categories=()), max_size=40)  # lone surrogates too: JSON's "\ud800" escapes
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | TEXT,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
TASKS = st.sampled_from(["sentiment", "other", ""]) | st.text(max_size=10)
BODIES = (
    st.fixed_dictionaries({}, optional={"input": JSON, "inputs": st.lists(JSON, max_size=5),
                                        "task": TASKS | st.lists(TASKS, max_size=3), "extra": JSON})
    | JSON
)


@pytest.fixture(scope="module")
def api(tmp_path_factory) -> TrunkAPI:
    """The worker's side of a one-task server, as LitServe sets it up."""
    folder = tmp_path_factory.mktemp("fuzz")
    rng = random.Random(0)
    files = {split: write_rows(folder / f"{split}.csv", [sentiment_example(rng) for _ in range(64)])
             for split in ("train", "validation")}
    fit = run_cli(["fit", *single_task([
        *TINY_MODEL, "--data=trunk.datamodules.TextClassificationData", f"--data.train={files['train']}",
        f"--data.validation={files['validation']}", "--data.tokenizer_vocab_size=300", "--data.max_length=32",
        "--trainer.max_steps=1", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
        f"--trainer.default_root_dir={folder / 'run'}", "--seed_everything=0"])])
    api = TrunkAPI([fit.trainer.checkpoint_callback.last_model_path or fit.trainer.checkpoint_callback.best_model_path],
                   "32-true", "torch", 8, 1, False, Limits(inputs=4, chars=200, pixels=64 * 64))
    api.setup("cpu")
    return api


def answer(api: TrunkAPI, body) -> object:
    """What the server does with ``body``: ValidationError (FastAPI's 422), ``Refused`` (the worker's 422), or the
    records."""
    request = PredictRequest.model_validate(body)
    decoded = api.decode_request(request)
    if isinstance(decoded, Refused):
        return decoded
    return api.predict([decoded])[0]


@given(BODIES)
def test_any_json_body_is_answered_or_refused_in_words(api, body):
    try:
        result = answer(api, body)
    except ValidationError as err:
        assert err.errors()  # FastAPI turns these into a 422 listing the fields at fault
        return
    if isinstance(result, Refused):
        assert result.message and "Traceback" not in result.message
    else:
        records = result if isinstance(result, list) else [result]
        assert records and all(isinstance(r, dict) and ("label" in r or "sentiment" in r) for r in records), result


@given(st.text(max_size=200) | st.binary(max_size=200).map(bytes))
def test_any_raw_body_is_answered_or_refused_in_words(api, raw):
    """A body sent without a JSON content type arrives as its text (``curl -d``)."""
    try:
        result = answer(api, raw)
    except ValidationError:
        return
    assert isinstance(result, Refused) or isinstance(json.loads(raw), (dict,)), result


def test_a_text_that_is_not_valid_unicode_is_named_with_its_character(api):
    """JSON lets a request escape half a UTF-16 pair ("\\ud800"), which no tokenizer reads: its error named no input."""
    result = answer(api, json.loads('{"inputs": ["fine", "a lone \\ud800 half"]}'))
    assert isinstance(result, Refused)
    assert "input 1 is not valid Unicode" in result.message and "'\\ud800' at character 7" in result.message
