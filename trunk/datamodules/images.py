"""Image classification data: hub image datasets, MNIST IDX files, image folders, or built-in shapes."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import datasets
import numpy as np
import torch

from trunk.core.labels import fold_label
from trunk.datamodules import builtin
from trunk.datamodules.sources import BUILTIN_PREFIX, empty_split_error, load_split
from trunk.datamodules.text import Preprocessor, TaskData, checked_label_names, split_off, warn_alike

IDX_IMAGES, IDX_LABELS = "images-idx3-ubyte", "labels-idx1-ubyte"


def read_idx(path: Path, role: str) -> np.ndarray:
    """An IDX file (MNIST's format: big-endian header, then unsigned bytes), plain or gzip."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as err:
        raise ValueError(f"{role}: could not read '{path}': {err}") from err
    if len(data) < 4 or data[:2] != b"\0\0" or data[2] != 0x08:
        raise ValueError(f"{role}: '{path}' is not an IDX file of unsigned bytes (its header is {data[:4]!r}).")
    ndim = data[3]
    shape = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(shape)):
        raise ValueError(f"{role}: '{path}' is truncated: its header says {shape} but it holds {body.size} values.")
    return body.reshape(shape)


class ImageClassificationData(TaskData):
    """Labelled images for ``ImageClassification``, as normalised (B, C, H, W) batches.

    Sources (each split one of):
      * ``dataset``: a hub dataset (``mnist``, ``cifar10``, ``imagefolder`` with ``dataset_config``
        unset and splits ...) or a local dataset directory; ``trunk:shapes`` is built in (generated
        16x16 images of 5 shapes: no download, no files).
      * MNIST IDX files: the images file (``train-images-idx3-ubyte.gz``); the labels file beside it
        is found by name (``...-labels-idx1-ubyte.gz``). For ``predict`` it may be missing.
      * a folder of images with one sub-folder per class (``cats/1.jpg``); for ``predict``, a
        folder of images.

    Images are kept as bytes in memory and converted per batch: to float, optional augmentation
    (training only: random translation, horizontal flips), then per-channel normalisation with
    ``mean`` / ``std`` (unset: measured on the training split and stored in checkpoints).

    Batches: ``pixel_values`` (B, C, H, W) float, ``labels`` (B,) long (not in predict), ``id``
    (the image's file or index, in predict).

    Args:
        image_column / label_column: hub dataset columns; unset image column: the first image column.
        label_names: class names in id order; unset: from the data (ClassLabel names, folder names,
            or the sorted distinct labels).
        channels: convert images to 1 (grey) or 3 (RGB) channels; unset: as stored (must agree).
        image_size: resize images to this square size; unset: as stored (must all be one size).
        mean / std: per-channel normalisation of pixels scaled to [0, 1].
        random_translate: shift training images by up to this many pixels (zero fill).
        horizontal_flip: flip training images left-right half the time (not for digits or text).
        **kwargs: see ``TaskData`` (dataset, splits, val_fraction and test_fraction: held out per class, batch
            sizes, workers).
    """

    input_form = "an image: a file path, PIL image or uint8 array (served: a base64-encoded image file)"

    kinds = ("image_classification",)
    stem = "image"

    def __init__(
        self,
        image_column: str | None = None,
        label_column: str = "label",
        label_names: list[str] | None = None,
        channels: int | None = None,
        image_size: int | None = None,
        mean: list[float] | None = None,
        std: list[float] | None = None,
        random_translate: int = 0,
        horizontal_flip: bool = False,
        batch_size: int = 128,
        **kwargs,
    ) -> None:
        super().__init__(batch_size=batch_size, **kwargs)
        if self.select or not self.reading.is_default or self.hold_out_by:
            raise ValueError(
                "select, column_names, file_type, line_pattern, encoding and hold_out_by are for rows of text; image "
                "data reads folders, IDX files or hub splits whole. Give one split per folder or file, or a hub split "
                "name."
            )
        if any(isinstance(spec, (list, tuple)) for spec in self.split_specs.values()) or self.metrics_per_file:
            raise ValueError(
                "Image data takes one folder, IDX file or hub split per split, not a list (nor metrics_per_file)."
            )
        if channels not in (None, 1, 3):
            raise ValueError(f"channels must be 1 (grey), 3 (RGB) or unset, got {channels}.")
        self.image_column, self.label_column = image_column, label_column
        self._label_names = checked_label_names(label_names, fold=self.normalize_labels)
        self.channels, self.image_size = channels, image_size
        self.mean, self.std = mean, std
        self.random_translate, self.horizontal_flip = random_translate, horizontal_flip
        self._splits: dict[str, dict] = {}  # role -> {"images": uint8 (N, C, H, W), "labels": list, "ids": list}

    # -- reading -----------------------------------------------------------------------------------
    def split(self, role: str) -> dict:
        if role not in self._splits:
            if self.cut_from_train(role):
                self._hold_out()
            else:
                self._splits[role] = self._finish(self._read(self.spec(role), self.option(role)), self.option(role))
        return self._splits[role]

    def _hold_out(self) -> None:
        train = self._finish(self._read(self.spec("train"), self.option("train")), self.option("train"))
        for role, index in split_off(len(train["labels"]), self.held_out(), strata=train["labels"]).items():
            self._splits[role] = {"images": train["images"][index], "labels": [train["labels"][i] for i in index],
                                  "ids": [train["ids"][i] for i in index]}

    def _read(self, spec: str, role: str) -> dict:
        """-> {"images": list of (H, W, C) uint8 arrays or one (N, H, W[, C]) array, "labels": list | None, "ids":
        list}."""
        if self.dataset is not None and self.dataset.startswith(BUILTIN_PREFIX):
            return builtin.load_images(self.dataset[len(BUILTIN_PREFIX):], spec)
        if self.dataset is not None:
            return self._read_rows(load_split(self.dataset, self.dataset_config, spec, role), role)
        path = Path(spec).expanduser()
        if path.is_dir():
            return self._read_folder(path, role)
        if IDX_IMAGES in path.name:
            return self._read_idx(path, role)
        raise FileNotFoundError(
            f"{role}: '{spec}' is neither a folder of images nor an IDX images file (*-{IDX_IMAGES}[.gz]). Give one of "
            f"those, or a dataset name with {self.option('dataset')}."
        )

    def _read_idx(self, path: Path, role: str) -> dict:
        if not path.is_file():
            raise FileNotFoundError(f"{role}: IDX file '{path}' does not exist.")
        labels_path = path.with_name(path.name.replace(IDX_IMAGES, IDX_LABELS))
        if not labels_path.is_file() and not role.endswith(".predict"):
            raise FileNotFoundError(
                f"{role}: the labels of '{path}' should be in '{labels_path}', which does not exist."
            )
        images, labels = read_idx(path, role), None
        if labels_path.is_file():
            labels = read_idx(labels_path, role).tolist()
            if len(labels) != len(images):
                raise ValueError(
                    f"{role}: '{path}' holds {len(images)} images but '{labels_path}' {len(labels)} labels."
                )
        if self._label_names is None and labels is not None:
            self._label_names = [str(i) for i in range(max(labels) + 1)]  # IDX labels are digits 0..9
        return {"images": images, "labels": labels, "ids": list(range(len(images)))}

    def _read_folder(self, folder: Path, role: str) -> dict:
        files = sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith("."))
        if not files:
            raise empty_split_error(role, str(folder))
        images = [self._load_image(p, role) for p in files]
        if role.endswith(".predict"):  # any folder of images; no labels needed
            return {"images": images, "labels": None, "ids": [str(p) for p in files]}
        outside = [p.name for p in files if p.parent.parent != folder]  # not exactly one class folder deep
        if outside:
            raise ValueError(f"{role}: '{folder}' has images outside class folders ({outside[0]}, ...). Put each "
                             "class's images in a sub-folder named after the class (one level deep).")
        labels = [fold_label(p.parent.name, self.normalize_labels) for p in files]
        if self._label_names is None and role.endswith(".train"):
            self._label_names = sorted(set(labels))
            warn_alike(self._label_names, role)
        return {"images": images, "labels": labels, "ids": [str(p) for p in files]}

    @staticmethod
    def _load_image(path: Path, role: str):
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(path) as image:
                image.load()
                return image
        except (UnidentifiedImageError, OSError) as err:
            raise ValueError(
                f"{role}: '{path}' is not an image Pillow can read ({err}). Remove it from the folder."
            ) from err

    def _read_rows(self, ds: datasets.Dataset, role: str) -> dict:
        column = self.image_column or next(
            (name for name, f in ds.features.items() if isinstance(f, datasets.Image)), None
        )
        if column is None or column not in ds.column_names:
            raise ValueError(
                f"{role} has no image column{f' {self.image_column!r}' if self.image_column else ''}; its columns are "
                f"{ds.column_names}. Set {self.option('image_column')}."
            )
        labels = None
        if self.label_column in ds.column_names:
            feature = ds.features[self.label_column]
            labels = ds[self.label_column]
            if isinstance(feature, datasets.ClassLabel):
                if self._label_names is None:
                    self._label_names = list(feature.names)
                labels = [feature.names[i] for i in labels]
        elif not role.endswith(".predict"):
            raise ValueError(f"{role} has no label column '{self.label_column}'; its columns are {ds.column_names}. "
                           f"Set {self.option('label_column')}.")
        return {"images": list(ds[column]), "labels": labels, "ids": list(range(len(ds)))}

    def _finish(self, rows: dict, role: str) -> dict:
        """Images -> one uint8 (N, C, H, W) tensor (converted, resized, checked); labels -> ids."""
        if len(rows["images"]) == 0:
            raise empty_split_error(role, str(self.split_specs[role.rsplit(".", 1)[-1]]))
        if isinstance(rows["images"], list):  # one at a time: sizes may differ until resized
            conformed = [self._conform(torch.from_numpy(self._as_array(image))[None], role) for image in rows["images"]]
            shapes = sorted({tuple(t.shape[1:]) for t in conformed})
            if len(shapes) > 1:
                raise ValueError(
                    f"{role} has images of different shapes (height, width, channels) {shapes[:3]}. Set "
                    f"{self.option('image_size')} to resize them to one square size, and {self.option('channels')} to "
                    "convert them."
                )
            images = torch.cat(conformed)
        else:
            images = torch.from_numpy(np.array(rows["images"]))  # a writable copy
            # (N, H, W) grey -> (N, H, W, 1)
            images = self._conform(images[..., None] if images.ndim == 3 else images, role)
        images = images.permute(0, 3, 1, 2).contiguous()  # (N, C, H, W)
        labels = None
        if rows["labels"] is not None:
            if self._label_names is None and role.endswith(".train"):  # no names in the source: its distinct labels
                self._label_names = [str(label) for label in sorted(set(rows["labels"]))]
            names = self.label_names  # integer labels are positions in these
            index = {name: i for i, name in enumerate(self.label_order)}
            try:
                labels = [
                    index[names[label]]
                    if isinstance(label, int) and not isinstance(label, bool) and 0 <= label < len(names)
                    else index[str(label)]
                    for label in rows["labels"]
                ]
            except KeyError as err:
                raise ValueError(f"{role} has the label {err.args[0]!r}, which is not one of the classes {names}. "
                                 f"Fix the data, or set {self.option('label_names')} to include it.") from None
        return {"images": images, "labels": labels, "ids": rows["ids"]}

    @staticmethod
    def _as_array(image) -> np.ndarray:
        """One image (PIL, array or nested lists) -> (H, W, C) uint8: grey stays grey, anything else becomes RGB."""
        if hasattr(image, "convert"):  # PIL: palette, alpha, 16-bit ... -> L or RGB
            image = image.convert("L" if image.mode in ("L", "1", "I", "I;16", "F") else "RGB")
        array = np.asarray(image, dtype=np.uint8)
        return array[..., None] if array.ndim == 2 else array

    def _conform(self, images: torch.Tensor, role: str) -> torch.Tensor:
        """(N, H, W, C) uint8 -> the configured channel count and size."""
        images = self._convert_channels(images, role)
        if self.image_size and images.shape[1:3] != (self.image_size, self.image_size):
            images = (
                torch.nn.functional.interpolate(
                    images.permute(0, 3, 1, 2).float(), size=(self.image_size,) * 2, mode="bilinear", antialias=True
                )
                .round()
                .clamp(0, 255)
                .byte()
                .permute(0, 2, 3, 1)
            )
        return images

    def _convert_channels(self, images: torch.Tensor, role: str) -> torch.Tensor:
        """(N, H, W, C) uint8 -> the configured channel count (grey <-> RGB)."""
        have = images.shape[-1]
        if self.channels is None or have == self.channels:
            return images
        if have == 1 and self.channels == 3:
            return images.expand(*images.shape[:-1], 3).contiguous()
        if have == 3 and self.channels == 1:  # ITU-R 601 luma, as PIL's convert("L")
            weights = torch.tensor([0.299, 0.587, 0.114])
            return (images.float() @ weights).round().clamp(0, 255).byte()[..., None]
        raise ValueError(f"{role}: images have {have} channels; cannot convert them to channels={self.channels}.")

    @property
    def label_names(self) -> list[str]:
        if self._label_names is None and self.split_specs["train"] is not None:
            self.split("train")  # reading it names the classes
        if self._label_names is None:
            raise ValueError(
                f"No class names: set {self.option('label_names')}, or give a labelled {self.option('train')}."
            )
        return self._label_names

    # -- normalisation and augmentation ------------------------------------------------------------
    def _statistics(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.mean is None or self.std is None:  # measured once on the training images
            images = self.split("train")["images"].float() / 255
            self.mean = images.mean(dim=(0, 2, 3)).tolist() if self.mean is None else self.mean
            self.std = images.std(dim=(0, 2, 3)).clamp(min=1e-3).tolist() if self.std is None else self.std
        return torch.tensor(self.mean)[None, :, None, None], torch.tensor(self.std)[None, :, None, None]

    def _augment(self, images: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """Random shifts of up to ``random_translate`` pixels (zero fill) and optional left-right flips."""
        shift = self.random_translate
        if shift:
            B, C, H, W = images.shape
            padded = torch.nn.functional.pad(images, (shift, shift, shift, shift))
            dy, dx = torch.randint(0, 2 * shift + 1, (2, B), generator=generator).tolist()
            images = torch.stack([padded[i, :, y : y + H, x : x + W] for i, (y, x) in enumerate(zip(dy, dx))])
        if self.horizontal_flip:
            flip = torch.rand(images.shape[0], generator=generator) < 0.5
            images = torch.where(flip[:, None, None, None], images.flip(-1), images)
        return images

    def make_batch(self, role: str, indices: list[int], train: bool, generator: torch.Generator | None = None) -> dict:
        split = self._splits[role]
        images = split["images"][indices]
        if train:
            images = self._augment(images, generator)
        mean, std = self._statistics()
        batch = {"pixel_values": (images.float() / 255 - mean) / std}
        if split["labels"] is not None:
            batch["labels"] = torch.tensor([split["labels"][i] for i in indices])
        else:
            batch["id"] = [split["ids"][i] for i in indices]
        return batch

    def encode_inputs(self, inputs: list, ids: list | None = None) -> dict:
        """A predict batch from raw images: file paths, PIL images or (H, W[, C]) uint8 arrays. Each record's id:
        its ``ids`` entry, else a path's name or the image's position in ``inputs``."""
        images = [self._load_image(Path(x), "predict") if isinstance(x, (str, Path)) else x for x in inputs]
        ids = ids or [str(x) if isinstance(x, (str, Path)) else i for i, x in enumerate(inputs)]
        self._splits["_inputs"] = self._finish({"images": images, "labels": None, "ids": ids}, "inputs")
        return self.make_batch("_inputs", list(range(len(inputs))), train=False)

    # -- TaskData --------------------------------------------------------------------------------
    def preprocessor(self) -> Preprocessor:
        """Images as they are, each with its record's id (a path's name, else its position), batched by
        ``encode_inputs`` (decoded, resized, normalised as in training); one size: no order of length."""
        def encode(inputs: list) -> list:
            return [(x, str(x) if isinstance(x, (str, Path)) else i) for i, x in enumerate(inputs)]

        mean, std = (t.flatten().tolist() for t in self._statistics())
        return Preprocessor(encode, lambda examples: self.encode_inputs(*map(list, zip(*examples))), lambda example: 0,
                            self.input_form, self.stem, {"mean": mean, "std": std, "image_size": self.image_size})

    def prepare(self, role: str) -> None:
        self.split(role)
        if role == "train":
            self._statistics()

    def size(self, role: str) -> int:
        return len(self.split(role)["images"])

    def info(self) -> dict:
        return {**super().info(), "label_names": self.label_order}

    # -- checkpoints: the normalisation and the class names travel with the model ---------------------
    def state_dict(self) -> dict:
        mean, std = self._statistics()
        return {"mean": mean.flatten().tolist(), "std": std.flatten().tolist(), "label_names": self.label_order}

    def load_state_dict(self, state: dict) -> None:
        self.mean, self.std = state["mean"], state["std"]
        self._label_names = self._label_names or state["label_names"]
