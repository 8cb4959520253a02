"""BERT's masking of token ids, shared by masked-LM pretraining (``datamodules.corpus.TokenMasker``, in the
collator) and the auxiliary masked-LM of fine-tuning (``TrunkModule``'s ``aux_mlm``, on the task's own batch)."""

from __future__ import annotations

import torch

from trunk.core.codec import IGNORE_INDEX


def ensure_one(chosen: torch.Tensor, maskable: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """``chosen`` with one maskable position added when it has none: a loss needs at least one target."""
    if not chosen.any() and maskable.any():
        candidates = maskable.flatten().nonzero().squeeze(1)
        chosen = chosen.clone()
        chosen.view(-1)[candidates[torch.randint(len(candidates), (1,), generator=generator)]] = True
    return chosen


def corrupt(input_ids: torch.Tensor, chosen: torch.Tensor, mask_id: int, random_ids: torch.Tensor,
            generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The chosen positions become [MASK] (80%), a token drawn from ``random_ids`` (10%) or stay (10%).
    Returns (masked ids, labels): labels hold the original id where chosen, else IGNORE_INDEX."""
    labels = torch.where(chosen, input_ids, IGNORE_INDEX)
    roll = torch.rand(input_ids.shape, generator=generator, device=input_ids.device)
    drawn = random_ids[torch.randint(len(random_ids), input_ids.shape, generator=generator, device=random_ids.device)]
    masked = torch.where(chosen & (roll < 0.8), mask_id, input_ids)
    masked = torch.where(chosen & (roll >= 0.8) & (roll < 0.9), drawn.to(input_ids.device), masked)
    return masked, labels


def mask_tokens(
    input_ids: torch.Tensor,
    special_ids: torch.Tensor,
    mask_id: int,
    vocab_size: int,
    probability: float = 0.15,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask ``probability`` of the ordinary tokens of a (B, T) batch (never one of ``special_ids``: [PAD], [CLS] ...);
    a random replacement is an ordinary token too."""
    maskable = ~torch.isin(input_ids, special_ids)
    chosen = ensure_one(
        (torch.rand(input_ids.shape, generator=generator, device=input_ids.device) < probability) & maskable,
        maskable,
        generator,
    )
    ordinary = torch.ones(vocab_size, dtype=torch.bool, device=input_ids.device)
    ordinary[special_ids] = False
    return corrupt(input_ids, chosen, mask_id, ordinary.nonzero().squeeze(1), generator)
