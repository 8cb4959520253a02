"""Image classification by a ViT: a patch stem on the same ``Backbone`` the text tasks use."""

from __future__ import annotations

from typing import Literal

from trunk.models import Backbone, PatchStem, Trunk, TrunkConfig, init_weights
from trunk.tasks.pretrained import ARCHITECTURE_FIELDS, PretrainedTrunk, check_architecture
from trunk.tasks.sequence_classification import SequenceClassification

# What the blocks' weights depend on; the vocabulary and max_len belong to the text stem, which a ViT replaces.
BACKBONE_FIELDS = tuple(name for name in ARCHITECTURE_FIELDS if name not in ("vocab_size", "max_len"))


class ImageClassification(SequenceClassification):
    """Classify images from the [CLS] vector (or the mean of the patch vectors) of a ViT.

    Images are cut into ``patch_size`` squares, projected, given a [CLS] token and 2-D positions
    (``trunk.positions``: learned or sinusoidal; see ``models.PatchStem``) and fed to the trunk's
    ``Backbone``. Images of another size than ``image_size`` work when divisible by the patch size
    (positions are interpolated). ``init_from`` a trunk pretrained on text loads its blocks; the
    patch stem is new. Data comes from ``ImageClassificationData``; metrics and predictions are
    those of ``SequenceClassification`` (accuracy, macro-F1; label and probabilities per image).

    Args:
        label_names: class names in id order; linked from the data.
        image_size: the side of the (square) training images, in pixels: sizes the position table.
        patch_size: the side of each patch; must divide the image size.
        channels: 1 (grey) or 3 (RGB).
        pooling: ``cls`` or ``mean`` (over all tokens).
        head_dropout: dropout inside the classification head.
        **kwargs: see ``TrunkTask``: ``trunk``, ``optimizer``, ``init_from``, ``finetune``.
    """

    input_key = "pixel_values"

    def __init__(
        self,
        label_names: list[str],
        image_size: int = 28,
        patch_size: int = 4,
        channels: int = 1,
        pooling: Literal["cls", "mean"] = "cls",
        head_dropout: float = 0.1,
        **kwargs,
    ) -> None:
        self.image_size, self.patch_size, self.channels = image_size, patch_size, channels
        super().__init__(label_names, pooling, head_dropout, **kwargs)

    def build_trunk(self, cfg: TrunkConfig) -> Trunk:
        trunk = Trunk(PatchStem(cfg, self.image_size, self.patch_size, self.channels), Backbone(cfg))
        init_weights(trunk.backbone, cfg.init_std)
        return trunk

    def load_pretrained_trunk(self, pretrained: PretrainedTrunk) -> None:
        """The blocks (and final norm) of a trunk pretrained on any modality; the patch stem stays new."""
        check_architecture(self.trunk_config, pretrained.config, pretrained.path, BACKBONE_FIELDS)
        backbone = {k[len("backbone."):]: v for k, v in pretrained.trunk_weights.items() if k.startswith("backbone.")}
        self.trunk.backbone.load_state_dict(backbone)
