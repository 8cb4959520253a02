"""Image classification by a ViT: a patch stem on the same ``Backbone`` the text tasks use."""

from __future__ import annotations

from typing import Literal

from trunk.models import Pooling, Trunk
from trunk.tasks.objectives.classification import Classification


class ImageClassification(Classification):
    """Classify images from the [CLS] vector (or the mean of the patch vectors) of a ViT.

    Images are cut into ``patch_size`` squares, projected, given a [CLS] token and 2-D positions (``trunk.positions``:
    learned or sinusoidal; see ``models.PatchStem``) and fed to the trunk's ``Backbone``: the image stem of the trunk,
    beside the text stem when text tasks share the run. Images of another size than ``image_size`` work when divisible
    by the patch size (positions are interpolated). Metrics and predictions are those of ``SequenceClassification``
    (accuracy, macro-F1, MCC; label and probabilities per image, with the image's file or index as ``id``), shared
    through ``Classification``.

    Args:
        image_size: the side of the (square) training images, in pixels: sizes the position table.
        patch_size: the side of each patch; must divide the image size.
        channels: 1 (grey) or 3 (RGB).
        pooling: ``cls``, ``mean``, ``max`` (over all tokens) or ``attention`` (SigLIP's head; a trunk without [CLS],
            ``cls_token: false``, refuses ``cls``).
        head_dropout: dropout inside the classification head.
        primary_metric, positive_label, class_weights, label_smoothing, pooler, pooler_norm: see ``Classification``.
    """

    kind = "image_classification"
    stem = "image"
    input_key = "pixel_values"
    onnx_output = None  # the export takes token ids: images are not exported yet

    def __init__(self, image_size: int = 28, patch_size: int = 4, channels: int = 1, pooling: Pooling = "cls",
                 head_dropout: float = 0.1, primary_metric: Literal["acc", "f1_macro", "mcc", "f1_positive"] = "acc",
                 positive_label: str | None = None, class_weights: Literal["balanced"] | list[float] | None = None,
                 label_smoothing: float = 0.0, pooler: bool = True, pooler_norm: bool = False) -> None:
        super().__init__(
            pooling,
            head_dropout,
            primary_metric,
            positive_label,
            class_weights,
            label_smoothing,
            pooler,
            pooler_norm,
            image_size=image_size,
            patch_size=patch_size,
            channels=channels,
        )
        self.image_size, self.patch_size, self.channels = image_size, patch_size, channels

    def stem_options(self) -> dict:
        return {"image_size": self.image_size, "patch_size": self.patch_size, "channels": self.channels}

    def samples(self, trunk: Trunk, batch: dict) -> list[dict]:
        records = super().samples(trunk, batch)
        for record, image in zip(records, batch["pixel_values"]):
            record["wandb_image"] = image  # shown as an image in W&B tables; left out of the JSON lines
        return records
