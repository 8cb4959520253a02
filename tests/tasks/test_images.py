"""Image classification: the patch stem (shapes, patch locality, position interpolation), image data
(IDX files, image folders, hub-style rows, augmentation), the CLI, a text trunk's blocks, and bad input."""

import gzip
import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import single_task

from trunk.cli import run_cli
from trunk.datamodules import ImageClassificationData
from trunk.datamodules.images import read_idx
from trunk.models import PatchStem, TrunkConfig, sinusoidal_positions_2d


def stem(positions: str = "learned", image_size: int = 28, patch_size: int = 4, channels: int = 1) -> PatchStem:
    cfg = TrunkConfig(d_model=32, n_heads=4, dropout=0.0, positions=positions)
    return PatchStem(cfg, image_size, patch_size, channels).eval()


# -- the patch stem ---------------------------------------------------------------------------------


def test_patch_stem_shapes_and_patch_locality():
    patches = stem()
    images = torch.randn(2, 1, 28, 28)
    out = patches(images)
    assert out.shape == (2, 1 + 7 * 7, 32)
    assert torch.equal(out[0, 0], out[1, 0])  # [CLS] is the same learned vector for every image
    changed = images.clone()
    changed[:, :, 9, 14] += 5.0  # row 9, column 14: the patch at grid (2, 3), token 1 + 2 * 7 + 3
    moved = (patches(changed) - out).abs().sum(-1)[0]
    assert moved.nonzero().flatten().tolist() == [1 + 2 * 7 + 3]


def test_learned_positions_are_interpolated_for_other_image_sizes():
    patches = stem("learned")
    assert torch.equal(patches.positions(7, 7), patches.position)  # the trained size: the table itself
    with torch.no_grad():
        # rows 0..1
        patches.position.copy_(torch.linspace(0, 1, 7).repeat_interleave(7)[None, :, None].expand(1, 49, 32))
    resized = patches.positions(10, 10).reshape(10, 10, 32)
    assert resized.shape == (10, 10, 32)
    assert torch.allclose(resized[:, 0, 0], resized[:, 9, 0])  # still constant along each row
    assert (resized[1:, 0, 0] > resized[:-1, 0, 0]).all()  # and still increasing down the rows
    assert patches(torch.randn(2, 1, 40, 40)).shape == (2, 1 + 100, 32)


def test_sinusoidal_2d_positions_are_recomputed_and_rope_adds_none():
    patches = stem("sinusoidal")
    table = patches.positions(5, 6)[0]
    assert torch.allclose(table, sinusoidal_positions_2d(5, 6, 32))
    # row half
    assert torch.allclose(table.reshape(5, 6, 32)[2, :, :16], table.reshape(5, 6, 32)[2, 0, :16].expand(6, 16))
    assert stem("rope").positions(7, 7) is None


def test_bad_image_shapes_are_clear_errors():
    with pytest.raises(ValueError, match=r"patch_size=5 does not divide image_size=28.*\[1, 2, 4, 7, 14, 28\]"):
        stem(patch_size=5)
    with pytest.raises(ValueError, match="takes 1-channel images .* channels=1"):
        stem()(torch.randn(2, 3, 28, 28))
    with pytest.raises(ValueError, match=r"30x30 pixels do not split into 4x4 patches"):
        stem()(torch.randn(2, 1, 30, 30))


# -- data ---------------------------------------------------------------------------------------------


def write_idx(path: Path, array: np.ndarray) -> Path:
    data = (
        bytes([0, 0, 0x08, array.ndim])
        + struct.pack(f">{array.ndim}I", *array.shape)
        + array.astype(np.uint8).tobytes()
    )
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


@pytest.fixture
def idx_files(tmp_path) -> Path:
    rng = np.random.default_rng(0)
    write_idx(tmp_path / "train-images-idx3-ubyte.gz", rng.integers(0, 256, (40, 8, 8)))
    write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.arange(40) % 3)
    return tmp_path / "train-images-idx3-ubyte.gz"


def test_idx_files_are_read_with_their_labels(idx_files, tmp_path):
    images = read_idx(idx_files, "data.train")
    assert images.shape == (40, 8, 8) and images.dtype == np.uint8
    dm = ImageClassificationData(train=str(idx_files), val_fraction=0.25)
    dm.prepare("train")
    train, val = dm.split("train"), dm.split("validation")
    assert train["images"].shape == (30, 1, 8, 8) and val["images"].shape == (10, 1, 8, 8)
    assert sorted(val["labels"]) == [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]  # stratified: each digit keeps its share
    assert sorted(train["ids"] + val["ids"]) == list(range(40))  # a held-out slice, nothing lost or repeated
    assert torch.equal(train["images"][0, 0], torch.from_numpy(images[train["ids"][0]]))
    assert [train["labels"][i] for i in range(3)] == [train["ids"][i] % 3 for i in range(3)]
    assert dm.label_names == ["0", "1", "2"]
    held = ImageClassificationData(train=str(idx_files), val_fraction=0.25, test_fraction=0.25)
    assert held.has_split("test") and held.split("validation")["ids"] == val["ids"]  # validation as it was
    test = held.split("test")
    assert sorted(test["labels"]) == [0, 0, 0, 1, 1, 1, 2, 2, 2]  # a third of the 10 each class has left
    assert sorted(held.split("train")["ids"] + val["ids"] + test["ids"]) == list(range(40))
    (tmp_path / "short-images-idx3-ubyte").write_bytes(bytes([0, 0, 8, 3]) + struct.pack(">3I", 5, 8, 8) + b"\0" * 10)
    with pytest.raises(ValueError, match="truncated"):
        read_idx(tmp_path / "short-images-idx3-ubyte", "data.test")
    with pytest.raises(FileNotFoundError, match="labels .* should be in"):
        ImageClassificationData(test=str(tmp_path / "short-images-idx3-ubyte")).split("test")


def test_image_folders_name_classes_and_resize_on_request(tmp_path):
    from PIL import Image

    for cls, size in (("cat", (12, 12)), ("dog", (12, 12)), ("dog", (16, 10))):
        (tmp_path / "pets" / cls).mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((size[1], size[0], 3), 200, dtype=np.uint8)).save(
            tmp_path / "pets" / cls / f"{size[0]}x{size[1]}.png"
        )
    with pytest.raises(ValueError, match="images of different shapes .* data.tasks.task.image_size"):
        ImageClassificationData(train=str(tmp_path / "pets")).split("train")
    dm = ImageClassificationData(train=str(tmp_path / "pets"), image_size=8, channels=1)
    train = dm.split("train")
    assert (
        dm.label_names == ["cat", "dog"]
        and train["images"].shape == (3, 1, 8, 8)
        and sorted(train["labels"]) == [0, 1, 1]
    )
    assert train["images"].float().mean().item() == pytest.approx(200, abs=1)  # RGB (200, 200, 200) -> grey 200


def test_hub_style_rows_take_class_names_from_the_features(tmp_path):
    import datasets

    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["zero", "one"])})
    rows = {
        "image": [np.full((6, 6), 255 * (i % 2), dtype=np.uint8) for i in range(8)],
        "label": [i % 2 for i in range(8)],
    }
    (tmp_path / "hub").mkdir()
    datasets.Dataset.from_dict(rows, features=features).to_parquet(str(tmp_path / "hub/train.parquet"))
    dm = ImageClassificationData(dataset=str(tmp_path / "hub"), train="train")
    train = dm.split("train")
    assert dm.label_names == ["zero", "one"] and train["labels"][:4] == [0, 1, 0, 1]
    assert train["images"].shape == (8, 1, 6, 6) and train["images"][1].min() == 255


def test_augmentation_shifts_training_images_only():
    dm = ImageClassificationData(dataset="trunk:shapes", train="train", validation="validation", random_translate=3,
                                 mean=[0.0], std=[1.0])
    dm.prepare("train")
    image = torch.zeros(1, 1, 16, 16, dtype=torch.uint8)
    image[0, 0, 6:10, 6:10] = 255  # a block far from the edges: shifting keeps all of it
    dm._splits["one"] = {"images": image.expand(64, 1, 16, 16), "labels": [0] * 64, "ids": list(range(64))}
    shifted = dm.make_batch("one", list(range(64)), train=True)["pixel_values"]
    assert torch.allclose(shifted.sum((1, 2, 3)), torch.full((64,), 16.0))  # moved, never cut
    assert len({tuple(torch.nonzero(s[0])[0].tolist()) for s in shifted}) > 10  # to many different places
    plain = dm.make_batch("one", list(range(4)), train=False)["pixel_values"]
    assert torch.equal(plain, image.expand(4, 1, 16, 16).float() / 255)


# -- the task through the CLI -------------------------------------------------------------------------


def shapes_args(tmp_path: Path) -> list[str]:
    return single_task(
        [
            "--model=trunk.tasks.ImageClassification",
            "--model.image_size=16",
            "--model.patch_size=4",
            "--model.channels=1",
            "--model.trunk.d_model=32",
            "--model.trunk.n_layers=2",
            "--model.trunk.n_heads=4",
            "--model.trunk.d_ff=64",
            "--model.optimizer.lr=3e-3",
            "--data=trunk.datamodules.ImageClassificationData",
            "--data.dataset=trunk:shapes",
            "--data.train=train",
            "--data.validation=validation",
            "--data.test=test",
            "--data.batch_size=64",
            "--trainer.accelerator=cpu",
            "--trainer.devices=1",
            "--trainer.max_epochs=10",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
            f"--trainer.default_root_dir={tmp_path / 'run'}",
            "--seed_everything=0",
        ],
        "shapes",
    )


def test_fit_test_predict_through_the_cli(tmp_path):
    cli = run_cli(["fit", *shapes_args(tmp_path)])
    labels = cli.model.objectives["shapes"].label_names
    assert labels == ["cross", "diagonal", "horizontal", "square", "vertical"]
    # chance is 0.2; after fit, the CLI tests the best checkpoint
    assert (cli.trainer.callback_metrics["test/shapes/acc"] > 0.8)
    samples = [
        json.loads(line) for line in (Path(cli.trainer.log_dir) / "samples" / "shapes.jsonl").read_text().splitlines()
    ]
    assert samples and set(samples[0]) == {
        "epoch",
        "step",
        "id",
        "gold",
        "predicted",
        "probability",
    }  # the image itself: W&B only
    assert all(r["gold"] in labels and r["predicted"] in labels for r in samples)
    out = tmp_path / "predictions.jsonl"
    folder = tmp_path / "new"
    folder.mkdir()
    from PIL import Image

    from trunk.datamodules.builtin import shape_image

    rng = np.random.default_rng(7)
    names = [name for name in labels for _ in range(8)]
    for i, name in enumerate(names):  # new images, as files
        Image.fromarray(shape_image(rng, name)).save(folder / f"{i:02d}-{name}.png")
    run_cli(
        [
            "predict",
            *shapes_args(tmp_path),
            "--data.tasks.shapes.dataset=null",
            f"--data.tasks.shapes.predict={folder}",
            f"--predictions.output={out}",
            f"--ckpt_path={cli.trainer.checkpoint_callback.best_model_path}",
        ]
    )
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [Path(r["id"]).stem.split("-")[1] for r in records] == names
    assert sum(r["label"] == name for r, name in zip(records, names)) / len(names) > 0.8  # as good as on the test split
    assert all(sum(r["probs"].values()) == pytest.approx(1.0, abs=1e-4) for r in records)


def test_a_text_trunk_initialises_the_vit_blocks(tmp_path):
    from trunk.core.codec import Codec
    from trunk.datamodules.tokenizer import train_wordpiece
    from trunk.formats.trunk_dir import PretrainedTrunk, save_pretrained
    from trunk.models import build_trunk

    tokenizer = train_wordpiece(["some text to train a tokenizer on"] * 20, vocab_size=60)
    config = TrunkConfig(vocab_size=tokenizer.get_vocab_size(), d_model=32, n_layers=2, n_heads=4, d_ff=64, max_len=32)
    text_trunk = build_trunk(config)
    trunk_dir = save_pretrained(
        tmp_path / "trunk",
        PretrainedTrunk(tmp_path, config, {"text": {}}, text_trunk.state_dict(), codec=Codec(tokenizer)),
    )
    args = [a for a in shapes_args(tmp_path) if not a.startswith("--model.trunk")]
    cli = run_cli([*args, f"--model.init_from={trunk_dir}"], run=False)
    vit = cli.model.trunk
    assert all(torch.equal(v, text_trunk.backbone.state_dict()[k]) for k, v in vit.backbone.state_dict().items())
    assert set(vit.stems) == {"image"} and isinstance(vit.stems["image"], PatchStem)
    assert cli.model.trunk_config.d_model == 32  # the text trunk's width
