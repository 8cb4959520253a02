"""Position schemes, one file each, behind one interface (``base.PositionScheme``): absolute tables (``tables.py``:
learned, and sinusoidal in three layouts), rotary (``rotary.py``: rope), attention biases (``biases.py``: alibi, t5,
and MPNet's learned_relative, a table and t5's bias) and DeBERTa's disentangled attention (``disentangled.py``).
``POSITIONS`` maps ``TrunkConfig.positions`` to its scheme; a new scheme is a file here and its import below
(docs/architecture.md)."""

from trunk.models.positions.base import POSITIONS, PositionScheme, scheme
from trunk.models.positions.biases import T5, Alibi, LearnedRelative, PositionBias, alibi_slopes, relative_buckets
from trunk.models.positions.disentangled import QUERY_SCALE, Disentangled, DisentangledPositions, RelativeTable
from trunk.models.positions.rotary import Rotary, rotary_table, rotate
from trunk.models.positions.tables import (
    Learned,
    Sinusoidal,
    SinusoidalHalves,
    SinusoidalT2T,
    resize_grid,
    sinusoidal_positions,
    sinusoidal_positions_2d,
)

__all__ = [
    "POSITIONS",
    "QUERY_SCALE",
    "Alibi",
    "Disentangled",
    "DisentangledPositions",
    "Learned",
    "LearnedRelative",
    "PositionBias",
    "PositionScheme",
    "RelativeTable",
    "Rotary",
    "Sinusoidal",
    "SinusoidalHalves",
    "SinusoidalT2T",
    "T5",
    "alibi_slopes",
    "relative_buckets",
    "rotary_table",
    "rotate",
    "scheme",
    "sinusoidal_positions",
    "resize_grid",
    "sinusoidal_positions_2d",
]
