"""Hugging Face model folders in: a ``transformers`` checkpoint (``config.json`` + ``model.safetensors`` or
``pytorch_model.bin``, with its tokenizer files) read without ``transformers`` into a ``PretrainedTrunk``, which
``trunk import`` writes as a trunk directory and ``model.init_from`` takes directly.

One ``Family`` per architecture: how its ``config.json`` reads as a ``TrunkConfig`` (refusing by name what the trunk
cannot compute), and one mapping table from Trunk's module names to the family's (litgpt's
``convert_hf_checkpoint``, timm's ``checkpoint_filter_fn``). A weight the table does not name, or one it names that
the file lacks, is an error naming it. The pretrained masked-LM head comes along as the head of a task ``mlm``
(``MaskedLanguageModeling`` goes on pretraining from it); BERT's pooler starts the pooler of every [CLS]-pooled head
trained from the trunk, as ``transformers`` does.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pickle
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from tokenizers import Tokenizer, processors
from tokenizers.implementations import BertWordPieceTokenizer, ByteLevelBPETokenizer

from trunk.core.checkpoint import check_readable
from trunk.core.codec import OTHER_SPELLING, Codec, check_padding
from trunk.core.contract import TaskSpec
from trunk.formats import hub
from trunk.formats.hub import TRUNK_FILES
from trunk.formats.spm import MARIAN_FILES, SPM_FILES, m2m100_tokenizer, marian_tokenizers, spm_folder_tokenizer
from trunk.formats.trunk_dir import PretrainedTrunk, check_weights
from trunk.models import SpecialIds, TrunkConfig, build_trunk

if TYPE_CHECKING:
    from trunk.tasks.objectives.base import Objective

CONFIG, SAFETENSORS, SAFETENSORS_INDEX, PICKLE, PICKLE_INDEX = (
    "config.json", "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
    "pytorch_model.bin.index.json"
)
# the modules a transformers task model (for sequence or token classification, multiple choice, extractive QA) adds
# beside its base model: its fine-tuned head
TASK_HEAD = r"(pre_classifier|classifier|qa_outputs)\."
# what a Hub download of a foreign model fetches (hub.py): safetensors weights (pickled ones where a model has no
# others), the tokenizer files
MODULES = "modules.json"  # a sentence-transformers model's modules, in order (transformer_folder)
HF_FILES = [CONFIG, "*.safetensors", SAFETENSORS_INDEX, "preprocessor_config.json", "tokenizer.json",
            "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "vocab.json", "merges.txt", *SPM_FILES,
            *MARIAN_FILES]
ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh",
               "quick_gelu": "quick_gelu", "relu": "relu", "silu": "silu", "swish": "silu"}
# families whose architecture the trunk cannot compute, and why: refused by name
REFUSED = {
    "deberta": "DeBERTa (v1) fuses its attention projections with separate query and value biases (DeBERTa-v2 and v3, "
               "model type deberta-v2, are read)",
    "longformer": "Longformer's attention has separate global-attention projections",
    "xlnet": "XLNet is a permutation language model with two-stream attention",
    "deit": "distilled DeiT adds a distillation token beside [CLS] (DeiT without one ships as model type vit)",
}


def objective_of(kind: str, **options) -> Objective:
    """A head's task kind (a class of ``trunk.tasks``), imported when a model is converted rather than with this module:
    the kinds load torchmetrics (seconds), and `trunk import` should answer a mistyped option at once."""
    import trunk.tasks

    return getattr(trunk.tasks, kind)(**options)


@dataclass(frozen=True)
class HeadTable:
    """A pretrained head that comes along as a task's: its objective (from the config's values and the checkpoint's
    tensors), the table from its modules to the family's, the config key of its depth (its
    ``{i}``), and its weights that are the trunk's (tied)."""

    what: str  # in words, for the notes
    objective: Callable[[dict, dict], Objective]
    table: dict[str, str | tuple[str, ...]]
    depth: str | None = None
    tied: dict[str, str] = field(default_factory=dict)


def replaced_token_detection(table: dict[str, str], cls_context: bool = False) -> HeadTable:
    """A discriminator's replaced-token head, stored as the task ``electra`` (``configs/pretrain_electra.yaml``'s):
    the ELECTRA objective goes on from it, its generator (never released) fresh."""
    return HeadTable("replaced-token detection head",
                     lambda values, tensors: objective_of("ReplacedTokenDetection", cls_context=cls_context), table)


def masked_lm(table: dict[str, str]) -> HeadTable:
    """A masked-LM head: its decoder's weight is the token embedding; with DeBERTa's enhanced mask decoder where the
    checkpoint has the decoder's position table (``table``'s ``decoder_positions``)."""
    def objective(values: dict, tensors: dict) -> Objective:
        positions = tensors.get(f"{table.get('decoder_positions')}.weight")
        return objective_of("MaskedLanguageModeling", enhanced_mask_decoder=0 if positions is None else len(positions))

    return HeadTable("masked-LM head", objective, table, tied={"head.decoder.weight": "stems.text.token.weight"})


@dataclass(frozen=True)
class Family:
    """How one ``model_type`` maps into the trunk. ``table``: Trunk module -> the family's module (several: fused in
    order, queries then keys then values; ``{i}``: a block's number), inside the base model whose weights start with
    one of ``prefixes`` (a task model's, ``bert.``) or none (the base model saved alone). ``heads``: the pretrained
    heads that come along, by task name (a masked-LM head as ``mlm``, a seq2seq decoder as ``translation``).
    ``ignored``: weights of the family with no use here (a pre-training head Trunk has no kind for, the tied copies of
    the embeddings), by pattern."""

    config: Callable[[dict], TrunkConfig]
    table: dict[str, str | tuple[str, ...]]
    prefixes: tuple[str, ...]
    heads: dict[str, HeadTable] = field(default_factory=dict)
    pooler: str | None = None  # the module of the pretrained pooler (dense + tanh on [CLS])
    # the module of a pretrained attention-pooling head (SigLIP's: a probe, torch's MultiheadAttention, a norm, an MLP),
    # which starts every head that pools by attention
    attention_pool: str | None = None
    ignored: tuple[str, ...] = ()
    stems: Callable[[dict], dict] = lambda values: {"text": {}}  # the stems the trunk reads with, and their options
    # the family's tensors rewritten where Trunk keeps the same numbers in another form (ViT's [CLS] position folded
    # into [CLS]): (config values, tensors, prefix) -> tensors
    adjust: Callable[[dict, dict, str], dict] | None = None


def _block(attention: dict[str, str | tuple[str, ...]]) -> dict[str, str | tuple[str, ...]]:
    return {f"backbone.blocks.{{i}}.{ours}": theirs for ours, theirs in attention.items()}


BERT_BLOCK = _block({
    "attn.q_proj": "encoder.layer.{i}.attention.self.query",
    "attn.kv_proj": ("encoder.layer.{i}.attention.self.key", "encoder.layer.{i}.attention.self.value"),
    "attn.out_proj": "encoder.layer.{i}.attention.output.dense",
    "norm_attn": "encoder.layer.{i}.attention.output.LayerNorm",
    "ff.fc_in": "encoder.layer.{i}.intermediate.dense",
    "ff.fc_out": "encoder.layer.{i}.output.dense",
    "norm_ff": "encoder.layer.{i}.output.LayerNorm",
})
BERT_EMBEDDINGS = {
    "stems.text.token": "embeddings.word_embeddings",
    "stems.text.position": "embeddings.position_embeddings",
    "stems.text.segment": "embeddings.token_type_embeddings",
    "stems.text.norm": "embeddings.LayerNorm",
}


BERT_ONLY = {"position_embedding_type": "absolute", "is_decoder": False, "add_cross_attention": False}


def _check(values: dict, model_type: str, only: dict | None = None) -> None:
    """Refuse, by name, the options of a config that the trunk cannot honour: those of ``only`` (option -> the one value
    the trunk computes; BERT's by default) set otherwise, and an activation it lacks."""
    for name, supported in (BERT_ONLY if only is None else only).items():
        value = values.get(name, supported)
        if value != supported:
            raise ValueError(f"The {model_type} checkpoint has {name}={value!r}, which the trunk cannot compute "
                             f"(it supports {name}={supported!r} only).")
    act = values.get("hidden_act", values.get("activation", "gelu"))
    if act not in ACTIVATIONS:
        raise ValueError(f"The {model_type} checkpoint's activation {act!r} is not one the trunk has "
                         f"({', '.join(ACTIVATIONS)}).")


def with_zero_biases(tensors: dict, weights: list[str]) -> dict:
    """``tensors`` with a zero bias beside each of ``weights`` that has none (the trunk's linears and norms have biases;
    T5's, CLIP's patch projection and ModernBERT's have none, which is the same as a zero one)."""
    for name in weights:
        weight = tensors[name]
        tensors.setdefault(name[: -len("weight")] + "bias", weight.new_zeros(weight.shape[0]))
    return tensors


def bert_config(values: dict, model_type: str = "bert", position_offset: int = 0) -> TrunkConfig:
    _check(values, model_type)
    return TrunkConfig(
        vocab_size=values["vocab_size"], d_model=values["hidden_size"], n_layers=values["num_hidden_layers"],
        n_heads=values["num_attention_heads"], d_ff=values["intermediate_size"],
        dropout=values.get("hidden_dropout_prob", 0.1), attn_dropout=values.get("attention_probs_dropout_prob", 0.1),
        max_len=values.get("max_position_embeddings", 512) - position_offset, position_offset=position_offset,
        positions="learned", norm="post", embedding_norm=True, activation=ACTIVATIONS[values.get("hidden_act", "gelu")],
        layer_norm_eps=values.get("layer_norm_eps", 1e-12), segments=values.get("type_vocab_size", 2),
        init_std=values.get("initializer_range", 0.02), embedding_size=values.get("embedding_size"),
    )


def roberta_config(values: dict) -> TrunkConfig:
    # positions count from the padding id + 1 (fairseq's convention): the first rows of the table are never read
    return bert_config(values, values.get("model_type", "roberta"), position_offset=values.get("pad_token_id", 1) + 1)


def distilbert_config(values: dict) -> TrunkConfig:
    _check(values, "distilbert")
    return TrunkConfig(
        vocab_size=values["vocab_size"], d_model=values["dim"], n_layers=values["n_layers"],
        n_heads=values["n_heads"], d_ff=values["hidden_dim"], dropout=values.get("dropout", 0.1),
        attn_dropout=values.get("attention_dropout", 0.1), max_len=values.get("max_position_embeddings", 512),
        positions="learned", norm="post", embedding_norm=True, activation=ACTIVATIONS[values.get("activation", "gelu")],
        layer_norm_eps=1e-12, segments=0, init_std=values.get("initializer_range", 0.02),
    )


BERT = Family(
    bert_config, {**BERT_EMBEDDINGS, **BERT_BLOCK}, ("bert.",),
    heads={"mlm": masked_lm({"head.dense": "cls.predictions.transform.dense",
                             "head.norm": "cls.predictions.transform.LayerNorm", "head.decoder": "cls.predictions"})},
    pooler="pooler.dense",
    ignored=(r"cls\.seq_relationship\..*", r"cls\.predictions\.decoder\.(weight|bias)", r".*position_ids"),
)
ROBERTA = Family(
    roberta_config, {**BERT_EMBEDDINGS, **BERT_BLOCK}, ("roberta.",),
    heads={"mlm": masked_lm({"head.dense": "lm_head.dense", "head.norm": "lm_head.layer_norm",
                             "head.decoder": "lm_head"})},
    pooler="pooler.dense",
    ignored=(r"lm_head\.decoder\.(weight|bias)", r".*position_ids"),
)
ELECTRA = Family(
    bert_config, {**BERT_EMBEDDINGS, "stems.text.project": "embeddings_project", **BERT_BLOCK}, ("electra.",),
    # a generator checkpoint's masked-LM head; a discriminator's replaced-token head
    heads={"mlm": masked_lm({"head.dense": "generator_predictions.dense",
                             "head.norm": "generator_predictions.LayerNorm", "head.decoder": "generator_lm_head"}),
           "electra": replaced_token_detection({"head.dense": "discriminator_predictions.dense",
                                                "head.out": "discriminator_predictions.dense_prediction"})},
    ignored=(r"generator_lm_head\.weight", r".*position_ids"),
)


def albert_config(values: dict) -> TrunkConfig:
    """ALBERT: BERT's post-LN blocks, ``num_hidden_groups`` of them shared across the depth (``shared_blocks``), the
    narrow embedding projected up (``embedding_size``, as ELECTRA's)."""
    if values.get("inner_group_num", 1) != 1:
        raise ValueError(f"The albert checkpoint has inner_group_num={values['inner_group_num']}, which the trunk "
                         "cannot compute (it supports inner_group_num=1: one block per group, as every released "
                         "ALBERT).")
    if values.get("embedding_size", 128) == values["hidden_size"]:
        raise ValueError(f"The albert checkpoint has embedding_size=hidden_size={values['hidden_size']}, and projects "
                         "its embeddings between the two equal widths, which the trunk does only for narrower "
                         "embeddings (every released ALBERT's are 128 wide).")
    return dataclasses.replace(bert_config(values, "albert"), shared_blocks=values.get("num_hidden_groups", 1))


ALBERT_LAYER = "encoder.albert_layer_groups.{i}.albert_layers.0."
ALBERT = Family(
    albert_config,
    {**BERT_EMBEDDINGS, "stems.text.project": "encoder.embedding_hidden_mapping_in", **_block({
        "attn.q_proj": ALBERT_LAYER + "attention.query",
        "attn.kv_proj": (ALBERT_LAYER + "attention.key", ALBERT_LAYER + "attention.value"),
        "attn.out_proj": ALBERT_LAYER + "attention.dense",
        "norm_attn": ALBERT_LAYER + "attention.LayerNorm",
        "ff.fc_in": ALBERT_LAYER + "ffn",
        "ff.fc_out": ALBERT_LAYER + "ffn_output",
        "norm_ff": ALBERT_LAYER + "full_layer_layer_norm",
    })},
    ("albert.",),
    heads={"mlm": masked_lm({"head.dense": "predictions.dense", "head.norm": "predictions.LayerNorm",
                             "head.decoder": "predictions"})},
    pooler="pooler",
    # the decoder's tied copies, and the sentence-order head Trunk has no kind for
    ignored=(r"predictions\.decoder\.(weight|bias)", r"sop_classifier\..*", r".*position_ids"),
)
DISTILBERT = Family(
    distilbert_config,
    {
        "stems.text.token": "embeddings.word_embeddings",
        "stems.text.position": "embeddings.position_embeddings",
        "stems.text.norm": "embeddings.LayerNorm",
        **_block({
            "attn.q_proj": "transformer.layer.{i}.attention.q_lin",
            "attn.kv_proj": ("transformer.layer.{i}.attention.k_lin", "transformer.layer.{i}.attention.v_lin"),
            "attn.out_proj": "transformer.layer.{i}.attention.out_lin",
            "norm_attn": "transformer.layer.{i}.sa_layer_norm",
            "ff.fc_in": "transformer.layer.{i}.ffn.lin1",
            "ff.fc_out": "transformer.layer.{i}.ffn.lin2",
            "norm_ff": "transformer.layer.{i}.output_layer_norm",
        }),
    },
    ("distilbert.",),
    heads={"mlm": masked_lm({"head.dense": "vocab_transform", "head.norm": "vocab_layer_norm",
                             "head.decoder": "vocab_projector"})},
    ignored=(r"vocab_projector\.weight", r".*position_ids"),
)


def deberta_v2_config(values: dict) -> TrunkConfig:
    """DeBERTa-v2 and v3 (mDeBERTa-v3 too): BERT's post-LN blocks, no positions at the input, disentangled attention
    over log-bucketed relative positions (``trunk/models/positions/disentangled.py``) with the layers' own query and
    key projections."""
    # transformers' defaults where the file is silent (a config.json written by hand, or by an older version)
    values = {"relative_attention": False, "share_att_key": False, "position_biased_input": True,
              "conv_kernel_size": 0, "norm_rel_ebd": "none", **values}
    kinds = values.get("pos_att_type") or []
    kinds = sorted(k.strip() for k in (kinds.split("|") if isinstance(kinds, str) else kinds) if k.strip())
    _check({**values, "pos_att_type": kinds, "norm_rel_ebd": str(values["norm_rel_ebd"]).lower(),
            "embedding_size": values.get("embedding_size") or values["hidden_size"]}, "deberta-v2",
           {"relative_attention": True, "pos_att_type": ["c2p", "p2c"], "share_att_key": True,
            "position_biased_input": False, "conv_kernel_size": 0, "norm_rel_ebd": "layer_norm",
            "embedding_size": values["hidden_size"]})
    max_distance = values.get("max_relative_positions", -1)
    max_distance = max_distance if max_distance >= 1 else values.get("max_position_embeddings", 512)
    buckets = values.get("position_buckets", -1)
    return TrunkConfig(
        vocab_size=values["vocab_size"], d_model=values["hidden_size"], n_layers=values["num_hidden_layers"],
        n_heads=values["num_attention_heads"], d_ff=values["intermediate_size"],
        dropout=values.get("hidden_dropout_prob", 0.1), attn_dropout=values.get("attention_probs_dropout_prob", 0.1),
        max_len=values.get("max_position_embeddings", 512), positions="disentangled", norm="post", embedding_norm=True,
        activation=ACTIVATIONS[values.get("hidden_act", "gelu")], layer_norm_eps=values.get("layer_norm_eps", 1e-7),
        segments=values.get("type_vocab_size", 0), init_std=values.get("initializer_range", 0.02),
        # position_buckets > 0: that many rows each way, logarithmic up to max_relative_positions; else exact
        relative_buckets=2 * (buckets if buckets > 0 else max_distance),
        relative_max_distance=max_distance if buckets > 0 else 0,
    )


DEBERTA_POSITIONS = "embeddings.position_embeddings.weight"  # absolute positions: the enhanced mask decoder's alone
DEBERTA_DECODER_POSITIONS = "cls.predictions.decoder_positions"  # that table, read as the masked-LM head's


def deberta_v2_heads(values: dict, tensors: dict, prefix: str) -> dict:
    """The masked-LM head, saved under either of transformers' two layouts, read as BERT's; with it, the table of
    absolute positions DeBERTa's checkpoints keep in the embeddings (transformers reads none of it: no DeBERTa-v2 adds
    them at the input, and its masked-LM class has no enhanced mask decoder), as the head's decoder positions."""
    def bert_name(name: str) -> str:
        name = re.sub(r"^lm_predictions\.lm_head\.bias$", "cls.predictions.bias", name)
        return re.sub(r"^lm_predictions\.lm_head\.(dense|LayerNorm)\.", r"cls.predictions.transform.\1.", name)

    tensors = {bert_name(k): v for k, v in tensors.items()}
    if any(k.startswith("cls.predictions.") for k in tensors) and prefix + DEBERTA_POSITIONS in tensors:
        tensors[f"{DEBERTA_DECODER_POSITIONS}.weight"] = tensors.pop(prefix + DEBERTA_POSITIONS)
    return tensors


DEBERTA_V2 = Family(
    deberta_v2_config,
    {"stems.text.token": "embeddings.word_embeddings", "stems.text.segment": "embeddings.token_type_embeddings",
     "stems.text.norm": "embeddings.LayerNorm", "backbone.position_bias.embedding": "encoder.rel_embeddings",
     "backbone.position_bias.norm": "encoder.LayerNorm",
     **_block({
         "attn.q_proj": "encoder.layer.{i}.attention.self.query_proj",
         "attn.kv_proj": ("encoder.layer.{i}.attention.self.key_proj", "encoder.layer.{i}.attention.self.value_proj"),
         "attn.out_proj": "encoder.layer.{i}.attention.output.dense",
         "norm_attn": "encoder.layer.{i}.attention.output.LayerNorm",
         "ff.fc_in": "encoder.layer.{i}.intermediate.dense",
         "ff.fc_out": "encoder.layer.{i}.output.dense",
         "norm_ff": "encoder.layer.{i}.output.LayerNorm",
     })},
    ("deberta.",),
    # the masked-LM head; DeBERTa-v3's replaced-token head ([CLS]'s vector added to each token's, normed, then as
    # ELECTRA's)
    heads={"mlm": masked_lm({"head.dense": "cls.predictions.transform.dense",
                             "head.norm": "cls.predictions.transform.LayerNorm", "head.decoder": "cls.predictions",
                             "decoder_positions": DEBERTA_DECODER_POSITIONS}),
           "electra": replaced_token_detection({"head.norm": "mask_predictions.LayerNorm",
                                                "head.dense": "mask_predictions.dense",
                                                "head.out": "mask_predictions.classifier"}, cls_context=True)},
    # a task model's pooler (dense + GELU, not BERT's tanh) and classifier: a new task trains its own; the absolute
    # positions without a masked-LM head to decode with
    ignored=(r"cls\.predictions\.decoder\.(weight|bias)", r"pooler\..*", r"classifier\..*", r".*position_ids",
             rf"(deberta\.)?{re.escape(DEBERTA_POSITIONS)}"),
    adjust=deberta_v2_heads,
)


def mpnet_config(values: dict) -> TrunkConfig:
    """MPNet: BERT's post-LN blocks, RoBERTa's learned positions from the padding id + 1 on, and beside them T5's
    learned bias of the relative distance's bucket (32 buckets up to 128), shared by every layer; no token types."""
    config = bert_config({**values, "type_vocab_size": 0}, "mpnet", position_offset=values.get("pad_token_id", 1) + 1)
    return dataclasses.replace(config, positions="learned_relative",
                               relative_buckets=values.get("relative_attention_num_buckets", 32),
                               relative_max_distance=128)


MPNET = Family(
    mpnet_config,
    {"stems.text.token": "embeddings.word_embeddings", "stems.text.position": "embeddings.position_embeddings",
     "stems.text.norm": "embeddings.LayerNorm", "backbone.position_bias.embedding": "encoder.relative_attention_bias",
     **_block({
         "attn.q_proj": "encoder.layer.{i}.attention.attn.q",
         "attn.kv_proj": ("encoder.layer.{i}.attention.attn.k", "encoder.layer.{i}.attention.attn.v"),
         "attn.out_proj": "encoder.layer.{i}.attention.attn.o",
         "norm_attn": "encoder.layer.{i}.attention.LayerNorm",
         "ff.fc_in": "encoder.layer.{i}.intermediate.dense",
         "ff.fc_out": "encoder.layer.{i}.output.dense",
         "norm_ff": "encoder.layer.{i}.output.LayerNorm",
     })},
    ("mpnet.",),
    heads={"mlm": masked_lm({"head.dense": "lm_head.dense", "head.norm": "lm_head.layer_norm",
                             "head.decoder": "lm_head"})},
    pooler="pooler.dense",
    ignored=(r"lm_head\.decoder\.(weight|bias)", r".*position_ids"),
)


def modernbert_config(values: dict) -> TrunkConfig:
    """ModernBERT: pre-norm blocks on rotary positions, every ``global_attn_every_n_layers``-th attending globally (rope
    base ``global_rope_theta``) and the others within ``local_attention`` / 2 tokens (``local_rope_theta``), GeGLU, no
    norm before the first block's attention (the embeddings are normed), a final norm. Bias-free linears and norms
    (``bias: false``) as its own; one with some biases (``attention_bias``, ``mlp_bias``, ``norm_bias``) has zero
    biases where it has none."""
    _check({**values, "hidden_act": values.get("hidden_activation", "gelu")}, "modernbert",
           {"position_embedding_type": "absolute"})
    every = values.get("global_attn_every_n_layers", 3)
    types = values.get("layer_types") or ["full_attention" if i % every == 0 else "sliding_attention"
                                          for i in range(values["num_hidden_layers"])]
    if types != ["full_attention" if i % every == 0 else "sliding_attention" for i in range(len(types))]:
        raise ValueError(f"The modernbert checkpoint's layer_types {types} are not every {every}-th block global and "
                         "the others local, the pattern the trunk computes (global_every).")
    rope = values.get("rope_parameters") or {}
    bases = {kind: (rope.get(kind) or {}).get("rope_theta", values.get(key, default)) for kind, key, default in (
        ("full_attention", "global_rope_theta", 160000.0), ("sliding_attention", "local_rope_theta", 10000.0))}
    scaled = [kind for kind, params in rope.items() if (params or {}).get("rope_type", "default") != "default"]
    if scaled:
        raise ValueError(f"The modernbert checkpoint scales its rotary positions ({scaled}: "
                         f"{[rope[k]['rope_type'] for k in scaled]}), which the trunk does not compute.")
    return TrunkConfig(
        vocab_size=values["vocab_size"], d_model=values["hidden_size"], n_layers=values["num_hidden_layers"],
        n_heads=values["num_attention_heads"], d_ff=values["intermediate_size"], gated_ff=True,
        dropout=values.get("embedding_dropout", 0.0), attn_dropout=values.get("attention_dropout", 0.0),
        max_len=values.get("max_position_embeddings", 8192), positions="rope", norm="pre", embedding_norm=True,
        activation=ACTIVATIONS[values.get("hidden_activation", "gelu")], layer_norm_eps=values.get("norm_eps", 1e-5),
        init_std=values.get("initializer_range", 0.02), segments=0,
        local_window=values.get("local_attention", 128) // 2, global_tokens=0, global_every=every,
        rope_base=bases["full_attention"], rope_base_local=bases["sliding_attention"], first_block_norm=False,
        bias=modernbert_bias(values),
    )


def modernbert_bias(values: dict) -> bool:
    """Whether the trunk holding a ModernBERT has biases: where any of its blocks' linears or norms has them."""
    return any(values.get(name, False) for name in ("attention_bias", "mlp_bias", "norm_bias"))


def modernbert_adjust(values: dict, tensors: dict, prefix: str) -> dict:
    """The fused query-key-value projection split into the trunk's query and key-value ones; GeGLU's one input
    projection into the activated half (the gate here) and the other; zero biases where ModernBERT has none and the
    trunk has (the MLM head's dense layer's, and every one of a trunk with biases)."""
    if not any(k.endswith("decoder.bias") for k in tensors):  # a task model's head (dense + GELU + norm): not MLM's
        tensors = {re.sub(r"^head\.", "task_head.", k): v for k, v in tensors.items()}
    tensors = dict(tensors)
    for name in [k for k in tensors if ".attn.Wqkv." in k]:  # weights, and biases where it has them
        q, kv = tensors.pop(name).split([values["hidden_size"], 2 * values["hidden_size"]])
        tensors[name.replace("Wqkv", "Wq")], tensors[name.replace("Wqkv", "Wkv")] = q, kv
    for name in [k for k in tensors if ".mlp.Wi." in k]:
        gate, given = tensors.pop(name).chunk(2)
        tensors[name.replace("Wi", "Wgate")], tensors[name.replace("Wi", "Win")] = gate, given
    if not modernbert_bias(values):
        return with_zero_biases(tensors, [k for k in tensors if k == "head.dense.weight"])
    return with_zero_biases(tensors, [k for k in tensors if k.endswith(".weight") and not k.startswith("decoder.")
                                      and not k.endswith("tok_embeddings.weight")])


MODERNBERT = Family(
    modernbert_config,
    {"stems.text.token": "embeddings.tok_embeddings", "stems.text.norm": "embeddings.norm",
     **_block({
         "attn.q_proj": "layers.{i}.attn.Wq",
         "attn.kv_proj": "layers.{i}.attn.Wkv",
         "attn.out_proj": "layers.{i}.attn.Wo",
         "norm_attn": "layers.{i}.attn_norm",
         "ff.fc_gate": "layers.{i}.mlp.Wgate",
         "ff.fc_in": "layers.{i}.mlp.Win",
         "ff.fc_out": "layers.{i}.mlp.Wo",
         "norm_ff": "layers.{i}.mlp_norm",
     }),
     "backbone.final_norm": "final_norm"},
    ("model.",),
    heads={"mlm": masked_lm({"head.dense": "head.dense", "head.norm": "head.norm", "head.decoder": "decoder"})},
    # a task model's head (dense + GELU + norm) and classifier: a new task trains its own
    ignored=(r"decoder\.weight", r"task_head\..*", r"classifier\..*"),
    adjust=modernbert_adjust,
)


def vit_config(values: dict) -> TrunkConfig:
    if not values.get("qkv_bias", True):
        raise ValueError("The vit checkpoint has qkv_bias=False, which the trunk cannot compute (its attention "
                         "projections have biases).")
    _check(values, "vit")
    grid = values.get("image_size", 224) // values.get("patch_size", 16)
    return TrunkConfig(
        vocab_size=1, d_model=values["hidden_size"], n_layers=values["num_hidden_layers"],
        n_heads=values["num_attention_heads"], d_ff=values["intermediate_size"],
        dropout=values.get("hidden_dropout_prob", 0.0), attn_dropout=values.get("attention_probs_dropout_prob", 0.0),
        max_len=1 + grid * grid, positions="learned", norm="pre", embedding_norm=False,
        activation=ACTIVATIONS[values.get("hidden_act", "gelu")], layer_norm_eps=values.get("layer_norm_eps", 1e-12),
        init_std=values.get("initializer_range", 0.02),
    )


def vit_positions(values: dict, tensors: dict, prefix: str) -> dict:
    """ViT adds a position row to [CLS] too; the patch stem keeps [CLS] without one: that row is folded into [CLS]
    (the same sum), the rest is the patch grid's table."""
    cls, positions = f"{prefix}embeddings.cls_token", f"{prefix}embeddings.position_embeddings"
    if cls not in tensors or positions not in tensors:
        return tensors
    tensors = dict(tensors)
    table = tensors.pop(positions)
    tensors[f"{prefix}embeddings.cls"] = tensors.pop(cls) + table[:, :1]
    tensors[f"{prefix}embeddings.position"] = table[:, 1:]
    return tensors


# ViT's patch embedding and attention names, which DINOv2 keeps
VIT_PATCHES = {"stems.image": "embeddings",  # its cls and position (vit_positions)
               "stems.image.proj": "embeddings.patch_embeddings.projection"}
VIT_ATTENTION = {
    "attn.q_proj": "encoder.layer.{i}.attention.attention.query",
    "attn.kv_proj": tuple(f"encoder.layer.{{i}}.attention.attention.{kv}" for kv in ("key", "value")),
    "attn.out_proj": "encoder.layer.{i}.attention.output.dense",
}
VIT = Family(
    vit_config,
    {
        **VIT_PATCHES,
        **_block({
            **VIT_ATTENTION,
            "norm_attn": "encoder.layer.{i}.layernorm_before",
            "ff.fc_in": "encoder.layer.{i}.intermediate.dense",
            "ff.fc_out": "encoder.layer.{i}.output.dense",
            "norm_ff": "encoder.layer.{i}.layernorm_after",
        }),
        "backbone.final_norm": "layernorm",
    },
    ("vit.",),
    pooler="pooler.dense",
    # an image classifier's output layer (ImageNet's labels, say): a new task trains its own
    ignored=(r"classifier\.(weight|bias)", r".*mask_token"),
    stems=lambda values: {"image": {"image_size": values.get("image_size", 224), "patch_size": values.get(
        "patch_size", 16), "channels": values.get("num_channels", 3)}},
    adjust=vit_positions,
)


def dinov2_config(values: dict) -> TrunkConfig:
    """DINOv2: ViT's pre-norm blocks with layer scale; the giant's SwiGLU feed-forward as the trunk's gated one; with
    registers, its register tokens after [CLS]."""
    _check(values, values["model_type"], {"qkv_bias": True})
    registers = values.get("num_register_tokens", 0) if values["model_type"] == "dinov2_with_registers" else 0
    swiglu = values.get("use_swiglu_ffn", False)
    width = int(values["hidden_size"] * values.get("mlp_ratio", 4))
    grid = values.get("image_size", 518) // values.get("patch_size", 14)
    return TrunkConfig(
        vocab_size=1, d_model=values["hidden_size"], n_layers=values["num_hidden_layers"],
        n_heads=values["num_attention_heads"], d_ff=(int(width * 2 / 3) + 7) // 8 * 8 if swiglu else width,
        gated_ff=swiglu, dropout=values.get("hidden_dropout_prob", 0.0),
        attn_dropout=values.get("attention_probs_dropout_prob", 0.0), max_len=1 + registers + grid * grid,
        positions="learned", norm="pre", embedding_norm=False,
        activation="silu" if swiglu else ACTIVATIONS[values.get("hidden_act", "gelu")],
        layer_norm_eps=values.get("layer_norm_eps", 1e-6), init_std=values.get("initializer_range", 0.02),
        layer_scale=values.get("layerscale_value", 1.0), registers=registers,
        resize_antialias=values["model_type"] == "dinov2_with_registers",  # its reference code's resizing
    )


def dinov2_adjust(values: dict, tensors: dict, prefix: str) -> dict:
    """ViT's [CLS] position folded in (``vit_positions``); the layer scales' ``lambda1`` as ``weight``; SwiGLU's one
    input projection split into the gate (its first half, which SiLU reads) and the input, its output as fc2."""
    tensors = {re.sub(r"\.mlp\.weights_out\.", ".mlp.fc2.", re.sub(r"\.layer_scale(\d)\.lambda1$",
                                                                   r".layer_scale\1.weight", k)): v
               for k, v in vit_positions(values, tensors, prefix).items()}
    tensors = {re.sub(r"embeddings\.register_tokens$", "embeddings.registers", k): v for k, v in tensors.items()}
    for name in [k for k in tensors if ".mlp.weights_in." in k]:
        gate, given = tensors.pop(name).chunk(2)
        tensors[name.replace("weights_in", "gate")], tensors[name.replace("weights_in", "fc1")] = gate, given
    return tensors


DINOV2 = Family(
    dinov2_config,
    {
        **VIT_PATCHES,
        **_block({
            **VIT_ATTENTION,
            "norm_attn": "encoder.layer.{i}.norm1",
            "scale_attn": "encoder.layer.{i}.layer_scale1",
            "ff.fc_in": "encoder.layer.{i}.mlp.fc1",
            "ff.fc_gate": "encoder.layer.{i}.mlp.gate",  # SwiGLU's (dinov2_adjust)
            "ff.fc_out": "encoder.layer.{i}.mlp.fc2",
            "norm_ff": "encoder.layer.{i}.norm2",
            "scale_ff": "encoder.layer.{i}.layer_scale2",
        }),
        "backbone.final_norm": "layernorm",
    },
    ("dinov2.", "dinov2_with_registers."),
    # an image classifier's output layer, and the masked-image token of DINOv2's pretraining: a new task trains its own
    ignored=(r"classifier\.(weight|bias)", r".*mask_token"),
    stems=lambda values: {"image": {"image_size": values.get("image_size", 518), "patch_size": values.get(
        "patch_size", 14), "channels": values.get("num_channels", 3)}},
    adjust=dinov2_adjust,
)


def clip_vision(values: dict) -> dict:
    """The vision tower's settings: a CLIP model's ``vision_config`` (its text tower is not read), or the values of a
    vision model saved alone."""
    return values.get("vision_config") or values


def tower_config(values: dict, model_type: str, patch_size: int, activation: str, eps: float, cls_token: bool,
                 embedding_norm: bool) -> TrunkConfig:
    """A CLIP-like vision tower's trunk (pre-norm blocks, learned positions), its family's defaults given."""
    vision = clip_vision(values)
    _check(vision, model_type)
    grid = vision.get("image_size", 224) // vision.get("patch_size", patch_size)
    return TrunkConfig(
        vocab_size=1, d_model=vision["hidden_size"], n_layers=vision["num_hidden_layers"],
        n_heads=vision["num_attention_heads"], d_ff=vision["intermediate_size"], dropout=0.0,
        attn_dropout=vision.get("attention_dropout", 0.0), max_len=int(cls_token) + grid * grid, positions="learned",
        norm="pre", embedding_norm=embedding_norm, activation=ACTIVATIONS[vision.get("hidden_act", activation)],
        layer_norm_eps=vision.get("layer_norm_eps", eps), init_std=vision.get("initializer_range", 0.02),
        cls_token=cls_token,
    )


def clip_config(values: dict) -> TrunkConfig:
    """CLIP's vision tower: pre-norm blocks after a norm on the embeddings (``pre_layrnorm``), QuickGELU (OpenAI's) or
    GELU; its ``post_layernorm`` is the final norm, on every token (as timm reads CLIP; transformers' last hidden
    state stops before it, its pooled output is [CLS] after it)."""
    return tower_config(values, "clip", 32, "quick_gelu", 1e-5, cls_token=True, embedding_norm=True)


def clip_embeddings(values: dict, tensors: dict, prefix: str) -> dict:
    """CLIP's [CLS] (a vector) and its position row (the table's first) folded into the stem's [CLS]; the rest of the
    table is the patch grid's; the bias-free patch projection gets a zero bias."""
    cls, table = f"{prefix}embeddings.class_embedding", f"{prefix}embeddings.position_embedding.weight"
    if cls not in tensors or table not in tensors:
        return tensors
    tensors = dict(tensors)
    rows = tensors.pop(table)
    tensors[f"{prefix}embeddings.cls"] = (tensors.pop(cls) + rows[0])[None, None]
    tensors[f"{prefix}embeddings.position"] = rows[None, 1:]
    return with_zero_biases(tensors, [f"{prefix}embeddings.patch_embedding.weight"])


def clip_stems(values: dict, patch_size: int) -> dict:
    """A vision tower's patch stem as its config gives it (``patch_size``: the family's default)."""
    vision = clip_vision(values)
    return {"image": {"image_size": vision.get("image_size", 224), "patch_size": vision.get("patch_size", patch_size),
                      "channels": vision.get("num_channels", 3)}}


# CLIP's blocks and final norm, which SigLIP's tower keeps
CLIP_BLOCKS = {
    **_block({
        "attn.q_proj": "encoder.layers.{i}.self_attn.q_proj",
        "attn.kv_proj": ("encoder.layers.{i}.self_attn.k_proj", "encoder.layers.{i}.self_attn.v_proj"),
        "attn.out_proj": "encoder.layers.{i}.self_attn.out_proj",
        "norm_attn": "encoder.layers.{i}.layer_norm1",
        "ff.fc_in": "encoder.layers.{i}.mlp.fc1",
        "ff.fc_out": "encoder.layers.{i}.mlp.fc2",
        "norm_ff": "encoder.layers.{i}.layer_norm2",
    }),
    "backbone.final_norm": "post_layernorm",
}
CLIP = Family(
    clip_config,
    {
        "stems.image": "embeddings",  # its cls and position (clip_embeddings)
        "stems.image.proj": "embeddings.patch_embedding",
        "stems.image.norm": "pre_layrnorm",
        **CLIP_BLOCKS,
    },
    ("vision_model.",),
    # a CLIP model's text tower and its two projections into the joint space, an image classifier's output layer
    ignored=(r"text_model\..*", r"(text|visual)_projection\.weight", r"logit_scale", r"classifier\.(weight|bias)",
             r".*position_ids"),
    stems=lambda values: clip_stems(values, patch_size=32),
    adjust=clip_embeddings,
)


def siglip_config(values: dict) -> TrunkConfig:
    """SigLIP's vision tower: CLIP's pre-norm blocks without [CLS] (``cls_token: false``) and without a norm before
    them; ``post_layernorm`` as the final norm; its attention-pooling head starts the heads that pool by attention."""
    return tower_config(values, "siglip", 16, "gelu_pytorch_tanh", 1e-6, cls_token=False, embedding_norm=False)


def siglip_positions(values: dict, tensors: dict, prefix: str) -> dict:
    """SigLIP's position table (patches, no [CLS]), an embedding's (N, C) weight, as the patch stem's (1, N, C)."""
    name = f"{prefix}embeddings.position_embedding.weight"
    if name not in tensors:
        return tensors
    tensors = dict(tensors)
    tensors[f"{prefix}embeddings.position"] = tensors.pop(name)[None]
    return tensors


SIGLIP = Family(
    siglip_config,
    {
        "stems.image": "embeddings",  # its position table (siglip_positions)
        "stems.image.proj": "embeddings.patch_embedding",
        **CLIP_BLOCKS,
    },
    ("vision_model.",),
    attention_pool="head",
    # a SigLIP model's text tower and its scale and bias of the similarities, an image classifier's output layer
    ignored=(r"text_model\..*", r"logit_(scale|bias)", r"classifier\.(weight|bias)", r".*position_ids"),
    stems=lambda values: clip_stems(values, patch_size=16),
    adjust=siglip_positions,
)


# timm's ViT sizes by name (vision_transformer.py's model definitions): width, depth, heads
TIMM_VIT_SIZES = {"tiny": (192, 12, 3), "small": (384, 12, 6), "base": (768, 12, 12), "large": (1024, 24, 16),
                  "huge": (1280, 32, 16)}
# timm's ViT options that the trunk computes only at these values
TIMM_ONLY = {"class_token": True, "no_embed_class": False, "reg_tokens": 0, "pre_norm": False, "qk_norm": False,
             "global_pool": "token", "fc_norm": None, "qkv_bias": True}


def is_timm(values: dict) -> bool:
    """A timm model's config.json (the Hub's timm repositories): an ``architecture`` and its ``pretrained_cfg``, no
    ``model_type``."""
    return "model_type" not in values and "architecture" in values and "pretrained_cfg" in values


def timm_args(values: dict) -> dict:
    """A timm ViT's settings: its config's ``model_args`` over what its architecture's name says (vit_base_patch16_224:
    width 768, 12 blocks of 12 heads, 16-pixel patches, 224-pixel images)."""
    name = values["architecture"].split(".")[0]
    match = re.fullmatch(r"vit_(tiny|small|base|large|huge)_patch(\d+)_(\d+)", name)
    args = dict(values.get("model_args") or {})
    if match is None and not {"embed_dim", "depth", "num_heads", "patch_size"} <= set(args):
        raise ValueError(f"The timm model {values['architecture']!r} is not one of timm's plain ViTs "
                         "(vit_{tiny,small,base,large,huge}_patch{P}_{size}) and its config.json gives no model_args "
                         "with its shape: Trunk reads timm's plain ViTs (DINOv2, CLIP and SigLIP by their "
                         "transformers folders).")
    if match is not None:
        width, depth, heads = TIMM_VIT_SIZES[match.group(1)]
        args = {"embed_dim": width, "depth": depth, "num_heads": heads, "patch_size": int(match.group(2)),
                "img_size": int(match.group(3)), **args}
    size = (values["pretrained_cfg"].get("input_size") or [3, args.get("img_size", 224)])[-1]
    return {"img_size": size, "mlp_ratio": 4.0, "in_chans": 3, **args}


def timm_config(values: dict) -> TrunkConfig:
    """timm's ViT: ViT's pre-norm blocks (eps 1e-6), a fused query-key-value projection, layer scale where its
    ``init_values`` is set; what else its options choose is refused by name."""
    args = timm_args(values)
    for name, supported in TIMM_ONLY.items():
        if args.get(name, supported) not in (supported, *(("",) if name == "fc_norm" else ())):
            raise ValueError(f"The timm model {values['architecture']!r} has {name}={args[name]!r}, which the trunk "
                             f"cannot compute (it supports {name}={supported!r} only).")
    grid = args["img_size"] // args["patch_size"]
    return TrunkConfig(
        vocab_size=1, d_model=args["embed_dim"], n_layers=args["depth"], n_heads=args["num_heads"],
        d_ff=int(args["embed_dim"] * args["mlp_ratio"]), dropout=0.0, attn_dropout=0.0, max_len=1 + grid * grid,
        positions="learned", norm="pre", embedding_norm=False, activation="gelu", layer_norm_eps=1e-6,
        layer_scale=args.get("init_values") or 0.0,
    )


def timm_adjust(values: dict, tensors: dict, prefix: str) -> dict:
    """timm's names as ViT's where the trunk keeps the same numbers in another form: [CLS]'s position row folded into
    [CLS] (``vit_positions``), the fused query-key-value projection split into the query and the keys and values, the
    layer scales' ``gamma`` as ``weight``."""
    tensors = {re.sub(r"^cls_token$", "embeddings.cls_token", re.sub(r"^pos_embed$", "embeddings.position_embeddings",
                                                                      k)): v for k, v in tensors.items()}
    tensors = vit_positions(values, tensors, "")
    out = {}
    for name, tensor in tensors.items():
        name = re.sub(r"\.ls(\d)\.gamma$", r".ls\1.weight", name)
        if ".attn.qkv." in name:
            width = tensor.shape[0] // 3
            out[name.replace(".qkv.", ".q.")], out[name.replace(".qkv.", ".kv.")] = tensor[:width], tensor[width:]
        else:
            out[name] = tensor
    return out


def timm_stems(args: dict) -> dict:
    return {"image": {"image_size": args["img_size"], "patch_size": args["patch_size"], "channels": args["in_chans"]}}


TIMM_VIT = Family(
    timm_config,
    {"stems.image": "embeddings",  # its cls and position (timm_adjust)
     "stems.image.proj": "patch_embed.proj",
     **_block({
         "attn.q_proj": "blocks.{i}.attn.q",
         "attn.kv_proj": "blocks.{i}.attn.kv",
         "attn.out_proj": "blocks.{i}.attn.proj",
         "norm_attn": "blocks.{i}.norm1",
         "scale_attn": "blocks.{i}.ls1",
         "ff.fc_in": "blocks.{i}.mlp.fc1",
         "ff.fc_out": "blocks.{i}.mlp.fc2",
         "norm_ff": "blocks.{i}.norm2",
         "scale_ff": "blocks.{i}.ls2",
     }),
     "backbone.final_norm": "norm"},
    ("",),
    ignored=(r"head\.(weight|bias)",),  # its classifier (ImageNet's labels): a new task trains its own
    stems=lambda values: timm_stems(timm_args(values)),
    adjust=timm_adjust,
)


def seq2seq_config(values: dict, only: dict | None, activation: str, **architecture) -> TrunkConfig:
    """A BART-like encoder-decoder's encoder as the trunk (its decoder, of the same shape, is the translation head's);
    ``only``: the config's options the trunk computes at one value (``_check``; None: BERT's); ``activation``: the
    family's default; ``architecture``: the fields by which the family differs from BART (positions, norms)."""
    activation = values.get("activation_function", activation)
    _check({**values, "hidden_act": activation}, values["model_type"], only)
    for ours, theirs in (("attention_heads", "the heads"), ("ffn_dim", "the feed-forward width")):
        if values[f"encoder_{ours}"] != values[f"decoder_{ours}"]:
            encoder, decoder = values[f"encoder_{ours}"], values[f"decoder_{ours}"]
            raise ValueError(f"The {values['model_type']} checkpoint's encoder and decoder differ in {theirs} "
                             f"(encoder_{ours}={encoder}, decoder_{ours}={decoder}): Trunk's decoder has the trunk's "
                             "shape.")
    return TrunkConfig(**{
        "vocab_size": values["vocab_size"], "d_model": values["d_model"], "n_layers": values["encoder_layers"],
        "n_heads": values["encoder_attention_heads"], "d_ff": values["encoder_ffn_dim"],
        "dropout": values.get("dropout", 0.1), "attn_dropout": values.get("attention_dropout", 0.0),
        "max_len": values.get("max_position_embeddings", 1024), "layer_norm_eps": 1e-5,
        "init_std": values.get("init_std", 0.02),
        "activation": ACTIVATIONS[activation], **architecture})


def bart_config(values: dict) -> TrunkConfig:
    only = {"scale_embedding": False, "normalize_before": False, "add_final_layer_norm": False}
    return seq2seq_config(values, only, "gelu", position_offset=2, positions="learned", norm="post",
                          embedding_norm=True)


def marian_config(values: dict) -> TrunkConfig:
    """Marian (opus-mt): BART's post-LN layers over fixed sinusoidal positions (sines, then cosines), token embeddings
    scaled by sqrt(d_model), no embedding norm, one vocabulary for both sides."""
    only = {"share_encoder_decoder_embeddings": True, "normalize_before": False}
    return seq2seq_config(values, only, "gelu", positions="sinusoidal_halves", norm="post", embedding_norm=False,
                          scale_embedding=values.get("scale_embedding", False))


def m2m100_config(values: dict) -> TrunkConfig:
    """M2M100 and NLLB: pre-LN layers with a final norm on each side over fixed sinusoidal positions (tensor2tensor's
    layout, from padding id + 1 on), token embeddings scaled by sqrt(d_model)."""
    return seq2seq_config(values, None, "relu", positions="sinusoidal_t2t",
                          position_offset=values.get("pad_token_id", 1) + 1, norm="pre", embedding_norm=False,
                          scale_embedding=values.get("scale_embedding", True))


def mbart_config(values: dict) -> TrunkConfig:
    """mBART (mbart-large-50 and its fine-tuned translators): BART's learned positions and embedding norm, pre-LN layers
    with a final norm on each side."""
    return seq2seq_config(values, None, "gelu", positions="learned", position_offset=2, norm="pre",
                          embedding_norm=True, scale_embedding=values.get("scale_embedding", False))


def bart_layer(side: str) -> dict[str, str | tuple[str, ...]]:
    """One BART layer's modules ``side`` (encoder or decoder) as a Trunk block's."""
    layer = f"{side}.layers.{{i}}"
    return {
        "attn.q_proj": f"{layer}.self_attn.q_proj",
        "attn.kv_proj": (f"{layer}.self_attn.k_proj", f"{layer}.self_attn.v_proj"),
        "attn.out_proj": f"{layer}.self_attn.out_proj",
        "norm_attn": f"{layer}.self_attn_layer_norm",
        "ff.fc_in": f"{layer}.fc1",
        "ff.fc_out": f"{layer}.fc2",
        "norm_ff": f"{layer}.final_layer_norm",
    }


def bart_logits_bias(values: dict, tensors: dict, prefix: str) -> dict:
    """``final_logits_bias`` (1, vocab), outside the model's prefix, is the decoder's output bias; a decoder without one
    (M2M100's and NLLB's, which have none; a base model, ``BartModel``, saved without its LM head) has a zero bias, as
    ``transformers`` starts one (said, where the family has one). The shared token table may be stored under the
    encoder's name alone (a tied copy kept instead of ``shared``)."""
    tensors, shared = dict(tensors), f"{prefix}shared.weight"
    if shared not in tensors and f"{prefix}encoder.embed_tokens.weight" in tensors:  # the tied table under another name
        tensors[shared] = tensors[f"{prefix}encoder.embed_tokens.weight"]
    if "final_logits_bias" in tensors:
        tensors[f"{prefix}decoder.output_bias"] = tensors.pop("final_logits_bias")[0]
        return tensors
    table = tensors.get(shared)
    if table is not None and any(k.startswith(f"{prefix}decoder.layers.") for k in tensors):
        tensors[f"{prefix}decoder.output_bias"] = table.new_zeros(table.shape[0])
        if values["model_type"] != "m2m_100":
            warnings.warn("The checkpoint has no final_logits_bias (a base model saved without its language-model "
                          "head): the decoder's output bias starts at zero, as transformers starts it.", stacklevel=2)
    return tensors


def seq2seq_decoder(stem: dict[str, str]) -> HeadTable:
    """A BART-like decoder as the translation head's: its layers as BART's, ``stem``: the rest (Trunk's name ->
    theirs: a position table, an embedding norm, a final norm)."""
    return HeadTable(
        "decoder (sequence to sequence)",
        lambda values, tensors: objective_of("Translation", decoder_layers=values["decoder_layers"]),
        {
            "decoder": "decoder",  # its output bias (bart_logits_bias)
            **stem,
            **{f"decoder.blocks.{{i}}.{ours}": theirs for ours, theirs in bart_layer("decoder").items()},
            "decoder.blocks.{i}.cross_attn.q_proj": "decoder.layers.{i}.encoder_attn.q_proj",
            "decoder.blocks.{i}.cross_attn.kv_proj": ("decoder.layers.{i}.encoder_attn.k_proj",
                                                      "decoder.layers.{i}.encoder_attn.v_proj"),
            "decoder.blocks.{i}.cross_attn.out_proj": "decoder.layers.{i}.encoder_attn.out_proj",
            "decoder.blocks.{i}.norm_cross": "decoder.layers.{i}.encoder_attn_layer_norm",
        },
        depth="decoder_layers",
        tied={"decoder.stem.token.weight": "stems.text.token.weight"},
    )


BART = Family(
    bart_config,
    {"stems.text.token": "shared", "stems.text.position": "encoder.embed_positions",
     "stems.text.norm": "encoder.layernorm_embedding", **_block(bart_layer("encoder"))},
    ("model.",),
    heads={"translation": seq2seq_decoder({"decoder.stem.position": "decoder.embed_positions",
                                           "decoder.stem.norm": "decoder.layernorm_embedding"})},
    ignored=(r"(model\.)?(encoder|decoder)\.embed_tokens\.weight", r"lm_head\.weight"),
    adjust=bart_logits_bias,
)
MARIAN = Family(
    marian_config,
    {"stems.text.token": "shared", **_block(bart_layer("encoder"))},
    ("model.",),
    heads={"translation": seq2seq_decoder({})},
    # its fixed position tables (computed here: sinusoidal_halves), which older files store
    ignored=(r"(model\.)?(encoder|decoder)\.embed_(tokens|positions)\.weight", r"lm_head\.weight"),
    adjust=bart_logits_bias,
)
M2M100 = Family(
    m2m100_config,
    {"stems.text.token": "shared", **_block(bart_layer("encoder")), "backbone.final_norm": "encoder.layer_norm"},
    ("model.",),
    heads={"translation": seq2seq_decoder({"decoder.final_norm": "decoder.layer_norm"})},
    ignored=(r"(model\.)?(encoder|decoder)\.embed_tokens\.weight", r"lm_head\.weight"),
    adjust=bart_logits_bias,
)
MBART = Family(
    mbart_config,
    {"stems.text.token": "shared", "stems.text.position": "encoder.embed_positions",
     "stems.text.norm": "encoder.layernorm_embedding", **_block(bart_layer("encoder")),
     "backbone.final_norm": "encoder.layer_norm"},
    ("model.",),
    heads={"translation": seq2seq_decoder({"decoder.stem.position": "decoder.embed_positions",
                                           "decoder.stem.norm": "decoder.layernorm_embedding",
                                           "decoder.final_norm": "decoder.layer_norm"})},
    ignored=(r"(model\.)?(encoder|decoder)\.embed_tokens\.weight", r"lm_head\.weight"),
    adjust=bart_logits_bias,
)


def t5_config(values: dict) -> TrunkConfig:
    """T5 (v1.0, v1.1, flan-t5): pre-norm RMSNorm blocks with relative position biases, a plain or gated
    feed-forward."""
    if values["num_heads"] * values["d_kv"] != values["d_model"]:
        raise ValueError(f"The t5 checkpoint's attention is num_heads x d_kv = {values['num_heads']} x "
                         f"{values['d_kv']} wide in a d_model={values['d_model']} model; the trunk's heads split "
                         "d_model (num_heads x d_kv = d_model).")
    gated, _, act = values.get("feed_forward_proj", "relu").rpartition("-")
    activation = {"gelu": "gelu_new"}.get(act, act) if gated else act
    _check({**values, "hidden_act": activation}, values.get("model_type", "t5"))
    return TrunkConfig(
        vocab_size=values["vocab_size"], d_model=values["d_model"], n_layers=values["num_layers"],
        n_heads=values["num_heads"], d_ff=values["d_ff"], dropout=values.get("dropout_rate", 0.1),
        attn_dropout=values.get("dropout_rate", 0.1), max_len=512, positions="t5", norm="pre", rms_norm=True,
        gated_ff=gated == "gated", activation=ACTIVATIONS[activation],
        layer_norm_eps=values.get("layer_norm_epsilon", 1e-6),
        embedding_norm=False, relative_buckets=values.get("relative_attention_num_buckets", 32),
        relative_max_distance=values.get("relative_attention_max_distance", 128),
    )


def t5_tied(values: dict, tensors: dict) -> bool:
    """Whether the decoder's logits read the shared embeddings (T5 v1.0, and every T5 transformers 5 writes) or a
    projection of their own (a ``lm_head.weight`` of its own: T5 v1.1, flan-t5)."""
    return "lm_head.weight" not in tensors or values.get("tie_word_embeddings", True) is not False


def t5_adjust(values: dict, tensors: dict, prefix: str) -> dict:
    """T5's numbers in the trunk's form: its linear layers have no biases (zeros here), its attention does not divide
    the scores by sqrt(d_kv) (folded into the queries), a plain feed-forward's ``wi`` is the gated one's ``wi_1``, and
    with tied embeddings the decoder scales its output by d_model^-0.5 before the logits (folded into its final
    norm; mT5's own code never scales: its checkpoints have an output projection of their own); the output bias it
    lacks is zero."""
    tensors = {re.sub(r"DenseReluDense\.wi\.", "DenseReluDense.wi_1.", k): v for k, v in tensors.items()}
    linears = [k for k in tensors if re.search(r"\.(q|k|v|o|wi_0|wi_1|wo)\.weight$", k)]
    for name in linears:
        if name.endswith(".q.weight"):
            tensors[name] = tensors[name] * math.sqrt(values["d_kv"])
    tensors = with_zero_biases(tensors, linears)
    if "decoder.final_layer_norm.weight" in tensors:
        tied = t5_tied(values, tensors)
        if values.get("scale_decoder_outputs", tied and values.get("model_type", "t5") == "t5"):
            tensors["decoder.final_layer_norm.weight"] = tensors["decoder.final_layer_norm.weight"] * values[
                "d_model"] ** -0.5
        vocab = tensors["shared.weight"].shape[0]
        tensors["decoder.output_bias"] = torch.zeros(vocab, dtype=tensors["shared.weight"].dtype,
                                                     device=tensors["shared.weight"].device)
        if tied:
            tensors.pop("lm_head.weight", None)
    return tensors


def t5_layer(side: str, cross: bool) -> dict[str, str | tuple[str, ...]]:
    """One T5 block's modules ``side`` as a Trunk block's (a decoder's with its cross-attention)."""
    block, ff = f"{side}.block.{{i}}.layer", 2 if cross else 1
    attention = lambda module: {  # noqa: E731
        "q_proj": f"{module}.q", "kv_proj": (f"{module}.k", f"{module}.v"), "out_proj": f"{module}.o"}
    table = {**{f"attn.{k}": v for k, v in attention(f"{block}.0.SelfAttention").items()},
             "norm_attn": f"{block}.0.layer_norm", "ff.fc_in": f"{block}.{ff}.DenseReluDense.wi_1",
             "ff.fc_gate": f"{block}.{ff}.DenseReluDense.wi_0", "ff.fc_out": f"{block}.{ff}.DenseReluDense.wo",
             "norm_ff": f"{block}.{ff}.layer_norm"}
    if cross:
        table.update({f"cross_attn.{k}": v for k, v in attention(f"{block}.1.EncDecAttention").items()},
                     norm_cross=f"{block}.1.layer_norm")
    return table


T5_FAMILY = Family(
    t5_config,
    {"stems.text.token": "shared",
     "backbone.position_bias.embedding": "encoder.block.0.layer.0.SelfAttention.relative_attention_bias",
     **_block(t5_layer("encoder", cross=False)), "backbone.final_norm": "encoder.final_layer_norm"},
    ("",),
    heads={"translation": HeadTable(
        "decoder (sequence to sequence)",
        lambda values, tensors: objective_of(
            "Translation", decoder_layers=values.get("num_decoder_layers") or values["num_layers"],
            tied_output=values.get("tie_word_embeddings", True) is not False),
        {
            "decoder": "decoder",  # its output bias (zero: t5_adjust)
            "decoder.position_bias.embedding": "decoder.block.0.layer.0.SelfAttention.relative_attention_bias",
            **{f"decoder.blocks.{{i}}.{ours}": theirs for ours, theirs in t5_layer("decoder", cross=True).items()},
            "decoder.final_norm": "decoder.final_layer_norm",
            "decoder.output": "lm_head",
        },
        depth="num_decoder_layers",
        tied={"decoder.stem.token.weight": "stems.text.token.weight"},
    )},
    ignored=(r"(encoder|decoder)\.embed_tokens\.weight",),
    adjust=t5_adjust,
)
# camembert and mt5 are RoBERTa's and T5 v1.1's architectures under names of their own (transformers' classes copy them)
FAMILIES: dict[str, Family] = {"bert": BERT, "roberta": ROBERTA, "xlm-roberta": ROBERTA, "camembert": ROBERTA,
                               "electra": ELECTRA, "albert": ALBERT, "distilbert": DISTILBERT,
                               "deberta-v2": DEBERTA_V2, "mpnet": MPNET, "modernbert": MODERNBERT, "vit": VIT,
                               "dinov2": DINOV2, "dinov2_with_registers": DINOV2, "clip": CLIP,
                               "clip_vision_model": CLIP, "siglip": SIGLIP, "siglip_vision_model": SIGLIP,
                               "bart": BART, "marian": MARIAN, "m2m_100": M2M100, "mbart": MBART, "t5": T5_FAMILY,
                               "mt5": T5_FAMILY, "timm": TIMM_VIT}


def download(reference: str) -> Path:
    """``hf://ORG/NAME``: a Trunk directory's files or a Hugging Face model's (pickled weights only where it has no
    safetensors); an older sentence-transformers model's from its transformer's folder (``transformer_folder``)."""
    patterns = [*TRUNK_FILES, *HF_FILES, MODULES]
    root = hub.download(reference, patterns)
    inside = transformer_folder(root).relative_to(root)  # "." but for an older sentence-transformers model
    files = [MODULES, *(str(inside / pattern) for pattern in patterns)]
    if inside != Path("."):
        root = hub.download(reference, files)
    if is_hf_folder(root / inside) and not weight_files(root / inside):  # older models ship pickles alone
        pickles = (PICKLE, PICKLE_INDEX, "pytorch_model-*.bin")
        root = hub.download(reference, [*files, *(str(inside / pattern) for pattern in pickles)])
    return root / inside


def transformer_folder(folder: Path) -> Path:
    """Where a sentence-transformers model keeps its transformer: the folder its ``modules.json`` names for the
    Transformer module (older ones: ``0_Transformer/``; newer ones: the model's folder itself); any other folder is
    its own."""
    modules = folder / MODULES
    if is_hf_folder(folder) or not modules.is_file():
        return folder
    try:
        entries = json.loads(modules.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return folder
    paths = [e.get("path") for e in entries if isinstance(e, dict) and str(e.get("type", "")).endswith(".Transformer")
             ] if isinstance(entries, list) else []
    inside = paths[0] if paths and isinstance(paths[0], str) else ""
    return folder / inside if inside and (folder / inside).is_dir() else folder


def is_hf_folder(path: str | Path) -> bool:
    """A folder of a ``transformers`` model: a config.json with a ``model_type`` and no Trunk format."""
    config = Path(path) / CONFIG
    if not config.is_file():
        return False
    try:
        meta = json.loads(config.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False
    return isinstance(meta, dict) and ("model_type" in meta or is_timm(meta)) and "format" not in meta


def model_values(folder: Path) -> dict:
    """A model folder's ``config.json`` values, a timm model's with ``model_type: timm``."""
    values = _json(folder / CONFIG)
    return {**values, "model_type": "timm"} if is_timm(values) else values


def family_of(values: dict, source: Path) -> Family:
    model_type = values.get("model_type")
    if model_type in REFUSED:
        raise ValueError(f"'{source}' is a {model_type} model, which Trunk cannot import: {REFUSED[model_type]}, "
                         f"which the trunk does not compute. Supported model types: {', '.join(FAMILIES)}.")
    if model_type not in FAMILIES:
        raise ValueError(f"'{source}' is a {model_type!r} model; Trunk imports the model types "
                         f"{', '.join(FAMILIES)}.")
    return FAMILIES[model_type]


def weight_files(folder: Path) -> list[Path]:
    """The files holding a model folder's weights: safetensors (one file, or the shards its index lists), else
    pickled ones (``pytorch_model.bin``, or its shards); [] if none."""
    for whole, index in ((SAFETENSORS, SAFETENSORS_INDEX), (PICKLE, PICKLE_INDEX)):
        if (folder / whole).is_file():
            return [folder / whole]
        if (folder / index).is_file():
            return _shards(folder / index)
    return []


def _shards(index: Path) -> list[Path]:
    """The shard files a sharded checkpoint's index lists (its ``weight_map``: weight name -> file), each there."""
    try:
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
        raise ValueError(f"'{index}' is not a shard index (JSON with a weight_map of weight names to files). "
                         "Download the model again.") from None
    missing = [name for name in names if not (index.parent / name).is_file()]
    if missing:
        raise FileNotFoundError(f"'{index}' lists {len(missing)} shard(s) not in its folder ({', '.join(missing[:3])}"
                                f"{', ...' if len(missing) > 3 else ''}): download every shard of the model.")
    return [index.parent / name for name in names]


def read_pickled(file: Path) -> dict[str, torch.Tensor]:
    """A ``torch.save`` file's tensors (``weights_only``), memory-mapped; one in the legacy (non-zip) format, which
    cannot be mapped, read whole."""
    try:
        return torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError as err:
        if "mmap" not in str(err):
            raise
        return torch.load(file, map_location="cpu", weights_only=True)


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The folder's weights (``weight_files``), pickles read with ``weights_only=True`` (tensors only: a pickle that
    would run code is refused). Old checkpoints' LayerNorm ``gamma`` / ``beta`` are read as ``weight`` / ``bias``."""
    files = weight_files(folder)
    if not files:
        raise FileNotFoundError(f"'{folder}' holds no weights: a Hugging Face model folder has {SAFETENSORS} (or "
                                f"shards with {SAFETENSORS_INDEX}) or {PICKLE} (or shards with {PICKLE_INDEX}).")
    check_readable(*files)
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            if file.suffix == ".bin":
                tensors.update(read_pickled(file))
            else:
                tensors.update(load_file(str(file)))
        except pickle.UnpicklingError:
            raise ValueError(f"'{file}' holds more than tensors (a pickle that loads only by running its code), so it "
                             "is refused: Trunk reads pickled weights with weights_only=True. Convert it to "
                             "safetensors where you trust its source.") from None
        except (SafetensorError, OSError, RuntimeError, ValueError) as err:
            raise ValueError(f"'{file}' is corrupted or not a weights file ({str(err).splitlines()[0]}). Download "
                             "the model again.") from None
    return {re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", k)): v
            for k, v in tensors.items()}


def read_tokenizer(folder: Path) -> tuple[Tokenizer, list[str], Tokenizer | None]:
    """The model's own tokenizer as it ships (``tokenizer.json``, else BERT's ``vocab.txt`` with its lowercasing,
    RoBERTa's BPE files, Marian's two segmenters, M2M100's segmenter over vocab.json, or a SentencePiece model),
    what was changed (padding and truncation switched on in the file are cleared: the data pads and cuts per batch; a
    fixed padding would make every input that long), and the tokenizer of a decoder's outputs where it has one of its
    own (Marian's ``target.spm``)."""
    config, target = _json(folder / "tokenizer_config.json"), None
    if (folder / "tokenizer.json").is_file():
        try:
            tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception as err:  # the Rust error names no file
            raise ValueError(f"Could not read '{folder / 'tokenizer.json'}': {err}") from None
    elif (folder / "vocab.txt").is_file():  # BERT's WordPiece: [CLS] a [SEP] b [SEP]
        tokenizer = BertWordPieceTokenizer(str(folder / "vocab.txt"), lowercase=config.get("do_lower_case", True),
                                           strip_accents=config.get("strip_accents"))._tokenizer
    elif (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file():  # RoBERTa's: <s> a </s></s> b </s>
        prefix_space = config.get("add_prefix_space", False)
        tokenizer = ByteLevelBPETokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"),
                                          add_prefix_space=prefix_space)._tokenizer
        tokenizer.add_special_tokens([t for t in OTHER_SPELLING.values() if tokenizer.token_to_id(t) is not None])
        sep, cls = (("</s>", tokenizer.token_to_id("</s>")), ("<s>", tokenizer.token_to_id("<s>")))
        tokenizer.post_processor = processors.RobertaProcessing(sep, cls, add_prefix_space=prefix_space)
    elif (folder / "source.spm").is_file() or (folder / "target.spm").is_file():
        tokenizer, target = marian_tokenizers(folder)
    elif (folder / "sentencepiece.bpe.model").is_file() and (folder / "vocab.json").is_file():  # M2M100's
        tokenizer = m2m100_tokenizer(folder, config)
    elif spm := next((folder / name for name in SPM_FILES if (folder / name).is_file()), None):
        tokenizer = spm_folder_tokenizer(spm, config)
    else:
        raise FileNotFoundError(f"'{folder}' has no tokenizer (tokenizer.json, BERT's vocab.txt, RoBERTa's "
                                f"vocab.json and merges.txt, or a SentencePiece {' / '.join(SPM_FILES)}). Give the "
                                "model's tokenizer folder with --tokenizer DIR.")
    cleared = []
    if tokenizer.padding is not None:
        cleared.append(f"padding to {tokenizer.padding.get('length') or 'the longest'}")
        tokenizer.no_padding()
    if tokenizer.truncation is not None:
        cleared.append(f"truncation at {tokenizer.truncation['max_length']}")
        tokenizer.no_truncation()
    check_padding(tokenizer, str(folder))
    return tokenizer, cleared, target


def _json(path: Path) -> dict:
    """A JSON file of the folder ({} if absent); one that does not parse is an error naming it."""
    if not path.is_file():
        return {}
    try:
        values = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"'{path}' is not valid JSON ({err}). Download the model again.") from None
    if not isinstance(values, dict):
        raise ValueError(f"'{path}' holds {type(values).__name__}, not the settings object it should.")
    return values


def _expand(table: dict[str, str | tuple[str, ...]], n_layers: int) -> dict[str, tuple[str, ...]]:
    """The table with one entry per block, each value a tuple of the family's modules."""
    out = {}
    for ours, theirs in table.items():
        theirs = (theirs,) if isinstance(theirs, str) else theirs
        for i in range(n_layers) if "{i}" in ours else [None]:
            out[ours.format(i=i)] = tuple(t.format(i=i) for t in theirs)
    return out


def _check_depth(table: dict[str, str | tuple[str, ...]], n_layers: int, tensors: dict, prefix: str,
                 source: str | Path) -> None:
    """A config's number of blocks against the blocks its weights hold, before anything is built: a ``config.json``
    saying ten million layers would otherwise keep the import building them. (Fewer blocks than the weights hold
    are named as unexpected weights, after the mapping.)"""
    pattern = next((t for theirs in table.values() for t in ((theirs,) if isinstance(theirs, str) else theirs)
                    if "{i}" in t), None)
    if pattern is None:
        return
    block = re.compile(re.escape(pattern).replace(re.escape("{i}"), r"(\d+)") + r"\.")
    held = {int(m.group(1)) for k in tensors if (m := block.match(k.removeprefix(prefix)))}
    if n_layers > len(held):
        absent = next(i for i in range(n_layers) if i not in held)
        raise ValueError(f"'{source}' does not map onto its {CONFIG}, which gives {n_layers} blocks: its weights hold "
                         f"{len(held)}, missing ['{prefix}{pattern.format(i=absent)}.weight', ...]. Download the model "
                         "again, or fix the file.")


def _take(expected: dict[str, torch.Size], table: dict[str, tuple[str, ...]], tensors: dict[str, torch.Tensor],
          prefix: str, used: set[str], missing: list[str]) -> dict[str, torch.Tensor]:
    """Each expected Trunk weight from its module's entry in ``table`` (fused ones concatenated on the output axis)."""
    out = {}
    for name in expected:
        module, leaf = name.rsplit(".", 1)
        if module not in table:
            missing.append(f"{name} (no entry in the mapping)")
            continue
        names = [f"{prefix}{theirs}.{leaf}" for theirs in table[module]]
        absent = [n for n in names if n not in tensors]
        if absent:
            missing.extend(absent)
            continue
        used.update(names)
        out[name] = tensors[names[0]] if len(names) == 1 else torch.cat([tensors[n] for n in names])
    return out


def attention_pool(tensors: dict, module: str, used: set[str]) -> dict[str, torch.Tensor]:
    """A SigLIP-style pooling head (``module``) as the weights of Trunk's ``AttentionPool``, keyed as the pretrained
    pooler is (``attention_pool.*``): torch's fused query-key-value projection split into the query and the keys and
    values."""
    names = {"probe": "probe", "attn.out_proj": "attention.out_proj", "norm": "layernorm", "ff.fc_in": "mlp.fc1",
             "ff.fc_out": "mlp.fc2"}
    out = {"attention_pool.probe": tensors[f"{module}.probe"]}
    for ours, theirs in names.items():
        for leaf in ("weight", "bias") if ours != "probe" else ():
            out[f"attention_pool.{ours}.{leaf}"] = tensors[f"{module}.{theirs}.{leaf}"]
    width = out["attention_pool.probe"].shape[-1]
    for leaf in ("weight", "bias"):
        fused = tensors[f"{module}.attention.in_proj_{leaf}"]
        out[f"attention_pool.attn.q_proj.{leaf}"], out[f"attention_pool.attn.kv_proj.{leaf}"] = fused[:width], fused[
            width:]
    used.update(k for k in tensors if k.startswith(f"{module}."))
    return out


@dataclass
class Mapped:
    """A foreign checkpoint's weights in Trunk's names."""

    config: TrunkConfig
    stems: dict[str, dict]
    trunk: dict[str, torch.Tensor]
    heads: dict[str, dict]
    pooler: dict[str, torch.Tensor]
    notes: list[str]


def map_weights(values: dict, tensors: dict[str, torch.Tensor], source: str | Path) -> Mapped:
    """A Hugging Face config (``config.json``'s values) and its weights in Trunk's names: the trunk's, the masked-LM
    head's (task ``mlm``) and the pooler's. Works on meta tensors too (the mapping of a real-size config, checked
    without memory)."""
    family = family_of(values, source)
    prefix = next((p for p in family.prefixes if any(k.startswith(p) for k in tensors)), "")
    try:  # a file's values: a missing key or a value of the wrong type is the file's fault, said as such
        config, stems = family.config(values), family.stems(values)
        if family.adjust is not None:
            tensors = family.adjust(values, tensors, prefix)
        _check_depth(family.table, config.n_blocks, tensors, prefix, source)
        with torch.device("meta"):  # names and shapes only
            trunk = build_trunk(config, stems)
    except (KeyError, TypeError, ZeroDivisionError, OverflowError, RuntimeError) as err:
        what = f"it lacks {err.args[0]!r}" if isinstance(err, KeyError) else f"{type(err).__name__}: {err}"
        raise ValueError(f"'{source}' has a {CONFIG} that does not describe a {values['model_type']} model Trunk can "
                         f"build ({what}). Download the model again, or fix the file.") from None
    expected = {k: v.shape for k, v in trunk.state_dict().items()}
    used: set[str] = set()
    missing: list[str] = []
    trunk_weights = _take(expected, _expand(family.table, config.n_blocks), tensors, prefix, used, missing)
    heads, notes, pooler = {}, [], {}
    for task, head in family.heads.items():
        sources = tuple(f"{t}." for theirs in head.table.values() for t in ((theirs,) if isinstance(theirs, str)
                                                                             else theirs))
        if not any(k.removeprefix(prefix).startswith(sources) for k in tensors):
            continue  # this checkpoint has no such head (a base model)
        depth = (values.get(head.depth) or config.n_layers) if head.depth else 0
        if depth:
            _check_depth(head.table, depth, tensors, prefix, source)
        objective = head.objective(values, tensors)
        with torch.device("meta"):
            objective.build(task, trunk, TaskSpec(target_vocab_size=config.vocab_size))
        wanted = {k: v.shape for k, v in objective.head_state().items()
                  if k not in head.tied and not k.startswith(objective.fresh_parts)}
        table = _expand(head.table, depth)
        head_prefix = prefix if any(k.startswith(prefix + next(iter(sources))) for k in tensors) else ""
        state = _take(wanted, table, tensors, head_prefix, used, missing)
        state.update({ours: trunk_weights.get(theirs) for ours, theirs in head.tied.items()})
        heads[task] = {"meta": objective.head_meta(), "state": state}
        notes.append(f"the pretrained {head.what}, as task '{task}'")
    if family.attention_pool and f"{prefix}{family.attention_pool}.probe" in tensors:
        pooler = attention_pool(tensors, f"{prefix}{family.attention_pool}", used)
        notes.append("its attention-pooling head, which starts every head that pools by attention")
    if family.pooler and f"{prefix}{family.pooler}.weight" in tensors:
        names = {leaf: f"{prefix}{family.pooler}.{leaf}" for leaf in ("weight", "bias")}
        pooler = {leaf: tensors[name] for leaf, name in names.items()}
        used.update(names.values())
        notes.append("its pooler, which starts the pooler of every [CLS]-pooled head")
    unexpected = sorted(k for k in tensors.keys() - used if not any(re.fullmatch(p, k) for p in family.ignored))
    # a fine-tuned task model's own head, outside its base model (BertForSequenceClassification's classifier):
    # a run's tasks train heads of their own (from the pooler, where it has one)
    fine_tuned = sorted({k.split(".")[0] for k in unexpected if prefix and re.match(TASK_HEAD, k)})
    if fine_tuned:
        unexpected = [k for k in unexpected if not (prefix and re.match(TASK_HEAD, k))]
        by_id = sorted((values.get("id2label") or {}).items(), key=lambda kv: str(kv[0]).zfill(9))  # "10" after "9"
        labels = [str(name) for _, name in by_id]
        notes.append(f"not its fine-tuned task head ({', '.join(fine_tuned)}"
                     f"{f'; labels {labels}' if labels and 'classifier' in fine_tuned else ''}): each task of a run "
                     "trains a head of its own")
    if missing or unexpected:
        raise ValueError(f"'{source}' does not map onto a {values['model_type']} trunk: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}{' ...' if len(missing) > 5 or len(unexpected) > 5 else ''}. "
                         "Is it a complete checkpoint of a supported architecture?")
    wrong = [f"{k}: {tuple(v.shape)}, the config says {tuple(expected[k])}" for k, v in trunk_weights.items()
             if v.shape != expected[k]]
    if wrong:
        raise ValueError(f"'{source}' does not match its {CONFIG}: {wrong[:5]}.")
    return Mapped(config, stems, trunk_weights, heads, pooler, notes)


def _decoder_starts(values: dict, heads: dict[str, dict], codec: Codec) -> list[str]:
    """A pretrained decoder's start token (``decoder_start_token_id``) kept with its head where it is not the one a
    decoder starts from by default (BART's, mBART's and NLLB's ``</s>``)."""
    start, notes = values.get("decoder_start_token_id"), []
    for task, head in heads.items():
        target = codec.target(task)
        if head["meta"]["kind"] == "translation" and start is not None and start != SpecialIds.of(target).bos:
            token = target.id_to_token(start)
            if token is None:
                raise ValueError(f"The config's decoder_start_token_id={start} is not a token of the model's "
                                 "tokenizer: they do not belong together. Give the model's own tokenizer.")
            head["meta"]["objective"]["init_args"]["decoder_start"] = token
            notes.append(f"its decoder starts from {token!r}, as it was trained (task '{task}''s decoder_start)")
    return notes


def convert(folder: str | Path, tokenizer_folder: str | Path | None = None) -> tuple[PretrainedTrunk, list[str]]:
    """A Hugging Face model folder as a ``PretrainedTrunk``, and notes on what was done (in words)."""
    folder = Path(folder)
    if not (folder / CONFIG).is_file():
        raise FileNotFoundError(f"'{folder}' is not a Hugging Face model folder: it has no {CONFIG}.")
    values = model_values(folder)
    family_of(values, folder)  # before reading any weights
    mapped = map_weights(values, read_weights(folder), folder)
    notes, codec = list(mapped.notes), Codec()
    if "text" in mapped.stems:
        tokenizer, cleared, target = read_tokenizer(Path(tokenizer_folder) if tokenizer_folder else folder)
        size, rows = tokenizer.get_vocab_size(), mapped.config.vocab_size
        # a table padded to a round size past the tokenizer (T5: 32,100 tokens in 32,128 rows; DeBERTa-v3: 128,001 in
        # 128,100)
        if size < rows and (rows % 64 == 0 or rows % 100 == 0) and rows - size < 128:
            tokenizer.add_special_tokens([f"<unused_row_{i}>" for i in range(size, rows)])
            notes.append(f"the tokenizer's {size} tokens padded to the embedding table's {rows} rows with unused "
                         "special tokens")
        elif size != rows:
            raise ValueError(f"The tokenizer has {size} tokens, but '{folder}' has {rows} rows in its embedding "
                             "table: they do not belong together. Give the model's own tokenizer (--tokenizer DIR).")
        if cleared:
            notes.append(f"the tokenizer's {' and '.join(cleared)} cleared (the data pads and cuts each batch)")
        # a decoder's own segmenter of its outputs, over the same vocabulary (Marian's)
        codec = Codec(tokenizer, {task: target for task in mapped.heads if target is not None})
        notes += _decoder_starts(values, mapped.heads, codec)
    processor = _json(folder / "preprocessor_config.json") or {
        f"image_{k}": v for k, v in (values.get("pretrained_cfg") or {}).items() if k in ("mean", "std")}  # timm's
    if "image" in mapped.stems and processor.get("image_mean"):
        notes.append(f"it was pretrained on images normalised with mean {processor['image_mean']} and std "
                     f"{processor.get('image_std')}: give the task's data these (data.tasks.<task>.mean / std)")
    check_weights(mapped.config, mapped.stems, mapped.trunk, folder / CONFIG)  # and that every value is finite
    return PretrainedTrunk(folder, mapped.config, mapped.stems, mapped.trunk, mapped.heads, codec, mapped.pooler), notes
