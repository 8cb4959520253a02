"""Hugging Face model folders out: a trunk of BERT's shape (imported, or trained here with ``norm: post``, learned
positions and an embedding LayerNorm), or of DeBERTa-v3's (``positions: disentangled``), and one of its heads written as
a folder ``transformers`` loads with ``AutoModel…from_pretrained`` (``trunk export CKPT DIR --format hf``). The mapping
tables are the import's (``trunk.formats.hf``), read backwards.

A head goes where ``transformers`` has the same head: sequence classification and multi-label classification on
[CLS] through a pooler (``BertForSequenceClassification``), token classification (``…ForTokenClassification``),
extractive QA (``…ForQuestionAnswering``) and the masked-LM head (``…ForMaskedLM``); the trunk alone is a
``BertModel`` (``…Model``).
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import torch
from safetensors.torch import save_file

from trunk.core.atomic import followed, replace_directory, temporary_path
from trunk.core.codec import CLS, MASK, OTHER_SPELLING, PAD, SEP, UNK, special_id
from trunk.formats.hf import (
    ALBERT,
    BERT,
    DEBERTA_DECODER_POSITIONS,
    DEBERTA_POSITIONS,
    DEBERTA_V2,
    ELECTRA,
    MARIAN,
    MODERNBERT,
    ROBERTA,
    Family,
    _expand,
)
from trunk.formats.trunk_dir import PretrainedTrunk
from trunk.models import SpecialIds, TrunkConfig, build_trunk
from trunk.models.deltas import DeltaConfig, DeltaRouter, TaskDelta

POOLED = ("sequence_classification", "multi_label_classification")
# a head's kind -> (the transformers class suffix, its weights' names there) per model type. A pooled head is BERT's
# pooler + classifier, RoBERTa's classification head (dense + tanh + out_proj on <s>), and DeBERTa's context pooler
# (its activation set to tanh in the config); ELECTRA's uses GELU there, so it has no such class.
ARCHITECTURES = {
    "bert": {kind: ("ForSequenceClassification", {"head.dense": "bert.pooler.dense", "head.classifier": "classifier"})
             for kind in POOLED},
    "roberta": {kind: ("ForSequenceClassification", {"head.dense": "classifier.dense",
                                                     "head.classifier": "classifier.out_proj"}) for kind in POOLED},
    "electra": {},
    "albert": {kind: ("ForSequenceClassification", {"head.dense": "albert.pooler", "head.classifier": "classifier"})
               for kind in POOLED},
    "deberta-v2": {kind: ("ForSequenceClassification", {"head.dense": "pooler.dense", "head.classifier": "classifier"})
                   for kind in POOLED},
}
for heads in ARCHITECTURES.values():
    heads.update(token_classification=("ForTokenClassification", {"head.classifier": "classifier"}),
                 extractive_qa=("ForQuestionAnswering", {"head": "qa_outputs"}))
# ModernBERT's task classes put its head (dense, activation, norm) before every output layer: a pooled head with
# pooler_norm is that, and a token or span head with head_norm
MODERNBERT_HEAD = {"head.dense": "head.dense", "head.norm": "head.norm", "head.classifier": "classifier"}
ARCHITECTURES["modernbert"] = {**{kind: ("ForSequenceClassification", MODERNBERT_HEAD) for kind in POOLED},
                               "token_classification": ("ForTokenClassification", MODERNBERT_HEAD),
                               "extractive_qa": ("ForQuestionAnswering", MODERNBERT_HEAD)}
ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu"}


# what a trunk's config must hold for a family to compute it (beside its positions, which pick the family)
PLAIN = {"rms_norm": False, "layer_scale": 0.0, "scale_embedding": False}
BERT_SHAPE = {"norm": "post", "embedding_norm": True, "local_window": 0, "gated_ff": False, "first_block_norm": True,
              "bias": True, **PLAIN}
SHAPES = {
    "bert": {**BERT_SHAPE, "shared_blocks": 0},
    "albert": {**BERT_SHAPE, "position_offset": 0},  # its blocks shared (shared_blocks)
    "deberta-v2": {**BERT_SHAPE, "position_offset": 0, "shared_blocks": 0},
    "modernbert": {"norm": "pre", "embedding_norm": True, "gated_ff": True, "first_block_norm": False, "segments": 0,
                   "position_offset": 0, "shared_blocks": 0, **PLAIN},
}
# a trunk's position scheme -> the family whose attention computes it (model type, name); learned: the BERT family's
BY_POSITIONS = {"learned": ("bert", "BERT"), "disentangled": ("deberta-v2", "DeBERTa-v2"),
                "rope": ("modernbert", "ModernBERT")}


def family_for(config: TrunkConfig) -> tuple[str, Family]:
    """The model type that computes what this trunk computes, by its positions: DeBERTa-v2 for disentangled ones,
    ModernBERT for rotary ones; for learned ones, of the BERT family, ALBERT for shared blocks, ELECTRA for a narrower
    embedding, RoBERTa for a position offset, else BERT. An error naming the fields the family does not have."""
    model_type, name = BY_POSITIONS.get(config.positions, BY_POSITIONS["learned"])
    if model_type == "bert" and config.shared_blocks:
        model_type, name = "albert", "ALBERT"
    wanted = {"positions": config.positions if config.positions in BY_POSITIONS else "learned", **SHAPES[model_type]}
    if model_type in ("deberta-v2", "modernbert"):
        wanted["embedding_size"] = config.d_model
    wrong = [f"{field}={getattr(config, field)!r} ({name}: {value!r})"
             for field, value in wanted.items() if getattr(config, field) != value]
    if config.activation not in ACTIVATIONS:
        wrong.append(f"activation={config.activation!r}")
    if model_type == "albert" and config.embedding_size == config.d_model:
        wrong.append(f"embedding_size={config.embedding_size} (ALBERT projects its embeddings up: below d_model)")
    if model_type == "modernbert" and config.local_window and not config.global_every:
        wrong.append("every block attending locally (ModernBERT's first block attends globally: global_every >= 1)")
    if model_type == "modernbert" and config.local_window and config.global_tokens:
        wrong.append(f"global_tokens={config.global_tokens} (ModernBERT's local blocks have none: 0)")
    if wrong:
        raise ValueError(f"--format hf writes BERT-family, DeBERTa-v2 and ModernBERT models, and this trunk has "
                         f"{', '.join(wrong)}, which transformers' {name} does not compute. Use the trunk directory "
                         "(or --onnx) instead.")
    if model_type != "bert":
        return model_type, {"deberta-v2": DEBERTA_V2, "modernbert": MODERNBERT, "albert": ALBERT}[model_type]
    if config.embedding_size != config.d_model:
        return "electra", ELECTRA
    return ("roberta", ROBERTA) if config.position_offset else ("bert", BERT)


def hf_config(model_type: str, config: TrunkConfig, tokenizer) -> dict:
    if model_type == "modernbert":
        return modernbert_values(config, tokenizer)
    pad_id = special_id(tokenizer, PAD)
    values = {
        "model_type": model_type, "vocab_size": config.vocab_size, "hidden_size": config.d_model,
        "num_hidden_layers": config.n_layers, "num_attention_heads": config.n_heads,
        "intermediate_size": config.d_ff, "hidden_act": ACTIVATIONS[config.activation],
        "hidden_dropout_prob": config.dropout, "attention_probs_dropout_prob": config.attn_dropout,
        "max_position_embeddings": config.max_len + config.position_offset,
        "type_vocab_size": max(config.segments, 1), "layer_norm_eps": config.layer_norm_eps,
        "initializer_range": config.init_std, "pad_token_id": pad_id, "position_embedding_type": "absolute",
    }
    if model_type in ("electra", "albert"):
        values["embedding_size"] = config.embedding_size
    if model_type == "albert":  # its default activation is gelu_new: always written
        values.update(num_hidden_groups=config.shared_blocks, inner_group_num=1)
    if model_type == "deberta-v2":  # positions in the attention only; a pooled head's activation is BERT's tanh
        exact = config.relative_max_distance == 0
        values.update(
            type_vocab_size=config.segments, position_embedding_type=None, relative_attention=True,
            pos_att_type=["p2c", "c2p"], share_att_key=True, position_biased_input=False, norm_rel_ebd="layer_norm",
            position_buckets=-1 if exact else config.relative_buckets // 2,
            max_relative_positions=config.relative_buckets // 2 if exact else config.relative_max_distance,
            pooler_hidden_size=config.d_model, pooler_hidden_act="tanh", pooler_dropout=config.dropout)
    return values


def modernbert_values(config: TrunkConfig, tokenizer) -> dict:
    """ModernBERT's config of the trunk: its attention pattern (the layer types and rope bases written both as
    transformers 5 reads them and as 4.48+ did), biases everywhere or nowhere."""
    every = config.global_every if config.local_window else 1
    types = ["full_attention" if i % every == 0 else "sliding_attention" for i in range(config.n_layers)]
    local_base = config.rope_base if config.rope_base_local is None else config.rope_base_local
    cls, sep = special_id(tokenizer, CLS), special_id(tokenizer, SEP)
    return {
        "model_type": "modernbert", "vocab_size": config.vocab_size, "hidden_size": config.d_model,
        "num_hidden_layers": config.n_layers, "num_attention_heads": config.n_heads,
        "intermediate_size": config.d_ff, "hidden_activation": ACTIVATIONS[config.activation],
        "max_position_embeddings": config.max_len, "norm_eps": config.layer_norm_eps,
        "initializer_range": config.init_std, "embedding_dropout": config.dropout,
        "attention_dropout": config.attn_dropout, "mlp_dropout": 0.0,
        "attention_bias": config.bias, "mlp_bias": config.bias, "norm_bias": config.bias, "decoder_bias": True,
        "local_attention": 2 * (config.local_window or 64), "global_attn_every_n_layers": every,
        "layer_types": types, "global_rope_theta": config.rope_base, "local_rope_theta": local_base,
        "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": config.rope_base},
                            "sliding_attention": {"rope_type": "default", "rope_theta": local_base}},
        "pad_token_id": special_id(tokenizer, PAD), "cls_token_id": cls, "sep_token_id": sep, "bos_token_id": cls,
        "eos_token_id": sep, "tie_word_embeddings": True,
        "classifier_activation": ACTIVATIONS[config.activation],  # its MLM head's; a pooled head's is tanh
    }


def modernbert_fused(tensors: dict[str, torch.Tensor], values: dict) -> dict[str, torch.Tensor]:
    """The trunk's query and key-value projections as ModernBERT's one ``Wqkv``, and its feed-forward's gate (the
    activated half) and input as one ``Wi``: ``modernbert_adjust`` backwards. The head's dense layer keeps a bias
    (``classifier_bias``) only where it is not zero, as a bias-free ModernBERT's came in."""
    bias = tensors.get("head.dense.bias")
    values["classifier_bias"] = bias is not None and bool(bias.any())
    if not values["classifier_bias"]:
        tensors.pop("head.dense.bias", None)
    for first, second, fused in ((".attn.Wq.", ".attn.Wkv.", ".attn.Wqkv."), (".mlp.Wgate.", ".mlp.Win.", ".mlp.Wi.")):
        for name in [k for k in tensors if first in k]:
            pair = [tensors.pop(name), tensors.pop(name.replace(first, second))]
            tensors[name.replace(first, fused)] = torch.cat(pair)
    return tensors


def hf_weights(family: Family, config: TrunkConfig, weights: dict[str, torch.Tensor], prefix: str
               ) -> dict[str, torch.Tensor]:
    """The trunk's weights in the family's names (fused projections split again)."""
    table = _expand(family.table, config.n_blocks)
    out = {}
    for name, tensor in weights.items():
        module, leaf = name.rsplit(".", 1)
        if module == "stems.text.segment" and not config.segments:
            continue
        theirs = table[module]
        for part, chunk in zip(theirs, tensor.chunk(len(theirs))):
            out[f"{prefix}{part}.{leaf}"] = chunk.contiguous()
    if not config.segments and family in (BERT, ROBERTA, ELECTRA, ALBERT):  # BERT's always adds a segment row: zeros
        out[f"{prefix}embeddings.token_type_embeddings.weight"] = torch.zeros(1, config.embedding_size)
    return out


def export_hf(pretrained: PretrainedTrunk, directory: str | Path, task: str | None = None, overwrite: bool = False
              ) -> tuple[Path, str]:
    """Write ``pretrained`` (with the head of ``task``, or its only head that transformers has) as a Hugging Face
    model folder; returns the folder and the transformers class that loads it. A translation head goes out as a
    Marian model (``export_marian``)."""
    directory = Path(directory)
    if "text" not in pretrained.stems or pretrained.codec.tokenizer is None:
        raise ValueError("--format hf writes text models; this one has no text stem.")
    translation = [name for name, head in pretrained.heads.items() if head["meta"]["kind"] == "translation"]
    if translation and (task in translation or task is None and len(pretrained.heads) == 1):
        return export_marian(pretrained, directory, task or translation[0], overwrite)
    model_type, family = family_for(pretrained.config)
    tokenizer, config = pretrained.codec.tokenizer, pretrained.config
    pad_id = special_id(tokenizer, PAD)
    if model_type == "roberta" and config.position_offset != pad_id + 1:
        raise ValueError(f"RoBERTa counts positions from its padding id + 1 ({pad_id + 1}), and this trunk's "
                         f"position_offset is {config.position_offset}: transformers would read other position rows.")
    head_task = pick_head(pretrained, task, model_type)
    prefix = family.prefixes[0]  # a task model's names (bert.encoder...); the base model alone has none
    values = hf_config(model_type, config, tokenizer)
    # a head trained with a LoRA: its delta written into the trunk's weights, one model that computes the task
    delta = head_task is not None and pretrained.heads[head_task]["meta"].get("peft")
    weights = merged_trunk(pretrained, head_task) if delta else pretrained.trunk_weights
    tensors = hf_weights(family, config, weights, prefix if head_task else "")
    name = {"bert": "Bert", "roberta": "Roberta", "electra": "Electra", "deberta-v2": "DebertaV2",
            "modernbert": "ModernBert", "albert": "Albert"}[model_type]
    architecture = f"{name}Model"
    if head_task is None and pretrained.pooler and family.pooler:
        tensors.update({f"{family.pooler}.{k}": v for k, v in pretrained.pooler.items()})
    if head_task is not None:
        head = pretrained.heads[head_task]
        kind = head["meta"]["kind"]
        state = {k: v for k, v in head["state"].items() if not k.startswith("delta.")}
        if kind == "masked_lm":
            suffix, table = "ForMaskedLM", family.heads["mlm"].table
        else:
            suffix, table = ARCHITECTURES[model_type][kind]
            options = head["meta"]["objective"].get("init_args") or {}
            if kind in POOLED:
                check_pooled_head(head_task, options, model_type, f"{name}{suffix}")
                if model_type == "modernbert":  # the head's pooling, and the pooler's tanh in its head
                    values.update(classifier_pooling=options.get("pooling", "cls"), classifier_activation="tanh")
            if kind in ("token_classification", "extractive_qa") and \
                    options.get("head_norm", False) != (model_type == "modernbert"):
                raise ValueError(f"Task '{head_task}' has head_norm={options.get('head_norm', False)}; transformers' "
                                 f"{name}{suffix} computes head_norm: {str(model_type == 'modernbert').lower()}. Train "
                                 "the task with it (or export it as a Trunk task directory).")
        for key, tensor in state.items():
            module, leaf = key.rsplit(".", 1)
            if module == "head.decoder" and leaf == "weight":
                continue  # the token embedding (tied)
            if module not in table:
                raise ValueError(f"Task '{head_task}': its head's weight {key} has no place in {name}{suffix}.")
            tensors[f"{table[module]}.{leaf}"] = tensor.contiguous()
        architecture = f"{name}{suffix}"
        labels = head["meta"].get("label_names") or []
        if labels and kind != "masked_lm":
            values.update(id2label=dict(enumerate(labels)), label2id={label: i for i, label in enumerate(labels)},
                          num_labels=len(labels))
        if kind == "multi_label_classification":
            values["problem_type"] = "multi_label_classification"
    values["architectures"] = [architecture]
    if model_type == "modernbert":
        tensors = modernbert_fused(tensors, values)
    if f"{DEBERTA_DECODER_POSITIONS}.weight" in tensors:  # where DeBERTa's own checkpoints keep it
        tensors[prefix + DEBERTA_POSITIONS] = tensors.pop(f"{DEBERTA_DECODER_POSITIONS}.weight")
        warnings.warn(f"Task '{head_task}' decodes with DeBERTa's enhanced mask decoder, which transformers' "
                      f"{architecture} does not compute (it reads the last layer): its table is written where "
                      "DeBERTa's checkpoints keep it, and transformers' masked-LM logits are not this head's.",
                      stacklevel=2)
    return write_hf_folder(directory, overwrite, tensors, values, tokenizer, config.max_len), architecture


def check_pooled_head(task: str, options: dict, model_type: str, architecture: str) -> None:
    """A pooled head that transformers' class computes: [CLS] through a pooler (BERT's, DeBERTa's, RoBERTa's), or [CLS]
    or the mean through a pooler with a norm after it (ModernBERT's head)."""
    modern = model_type == "modernbert"
    pooling, pooler = options.get("pooling", "cls"), options.get("pooler", True)
    norm = options.get("pooler_norm", False)
    if pooling in (("cls", "mean") if modern else ("cls",)) and pooler and norm == modern:
        return
    wanted = "pooling: cls or mean, pooler: true, pooler_norm: true" if modern else "pooling: cls, pooler: true, " \
        "pooler_norm: false"
    raise ValueError(f"Task '{task}' pools with pooling={pooling!r}, pooler={pooler}, pooler_norm={norm}; "
                     f"transformers' {architecture} computes {wanted}. Train the task with those (or export it as a "
                     "Trunk task directory).")


def write_hf_folder(directory: Path, overwrite: bool, tensors: dict[str, torch.Tensor], values: dict, tokenizer,
                    max_len: int, target=None) -> Path:
    """The folder, written whole or not at all: weights, config, the tokenizer (and a decoder's own target tokenizer,
    ``target_tokenizer.json``) with its special tokens' roles."""
    tmp = temporary_path(directory)
    shutil.rmtree(tmp, ignore_errors=True)
    directory = followed(Path(directory))
    check_hf_writable(directory, overwrite)
    tmp.mkdir(parents=True)
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(values, indent=2) + "\n")
    tokenizer.save(str(tmp / "tokenizer.json"))
    if target is not None:
        target.save(str(tmp / TARGET_TOKENIZER))
    roles = {"cls_token": CLS, "sep_token": SEP, "pad_token": PAD, "mask_token": MASK, "unk_token": UNK}
    spelled = {key: token if tokenizer.token_to_id(token) is not None else OTHER_SPELLING[token]
               for key, token in roles.items() if special_id(tokenizer, token) is not None}
    (tmp / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_len, **spelled}, indent=2
    ) + "\n")
    replace_directory(tmp, directory)
    return directory


TARGET_TOKENIZER = "target_tokenizer.json"
# Trunk's activations as transformers' seq2seq configs name them
SEQ2SEQ_ACTIVATIONS = {"silu": "swish", "gelu": "gelu", "relu": "relu", "gelu_tanh": "gelu_new"}


def export_marian(pretrained: PretrainedTrunk, directory: Path, task: str, overwrite: bool) -> tuple[Path, str]:
    """A trunk of Marian's shape (``positions: sinusoidal_halves``, post-LN, no embedding norm) and its translation
    head as a ``MarianMTModel`` folder: the import's tables read backwards, the decoder's output bias as
    ``final_logits_bias``. Its tokenizers go as ``tokenizer.json`` (sources) and ``target_tokenizer.json`` (targets),
    which ``tokenizers`` and ``PreTrainedTokenizerFast`` read; ``MarianTokenizer`` reads SentencePiece files, which a
    Trunk model does not keep: copy ``source.spm``, ``target.spm`` and ``vocab.json`` from the model it started from."""
    config, head = pretrained.config, pretrained.heads[task]
    wanted = {"positions": "sinusoidal_halves", "norm": "post", "embedding_norm": False, "position_offset": 0,
              "segments": 0, "embedding_size": config.d_model, "local_window": 0, "rms_norm": False,
              "gated_ff": False, "layer_scale": 0.0}
    wrong = [f"{name}={getattr(config, name)!r} (Marian: {value!r})" for name, value in wanted.items()
             if getattr(config, name) != value]
    options = head["meta"]["objective"].get("init_args") or {}
    if config.activation not in SEQ2SEQ_ACTIVATIONS:
        wrong.append(f"activation={config.activation!r}")
    if not options.get("share_embeddings", True) or not options.get("tied_output", True):
        wrong.append("a decoder with embeddings or an output projection of its own")
    if options.get("target_language"):
        wrong.append(f"target_language={options['target_language']!r} (Marian has no forced language code)")
    if wrong:
        raise ValueError(f"--format hf writes a translation model as Marian's, and this one has {', '.join(wrong)}, "
                         "which transformers' MarianMTModel does not compute. Use the trunk directory instead.")
    tokenizer = pretrained.codec.tokenizer
    target = pretrained.codec.targets.get(task)
    state = head["state"]
    depth = 1 + max(int(k.split(".")[2]) for k in state if k.startswith("decoder.blocks."))
    tensors = hf_weights(MARIAN, config, pretrained.trunk_weights, "model.")
    table = _expand(MARIAN.heads["translation"].table, depth)
    for key, tensor in state.items():
        module, leaf = key.rsplit(".", 1)
        if key == "decoder.output_bias":
            tensors["final_logits_bias"] = tensor[None].contiguous()
        elif key != "decoder.stem.token.weight":  # the shared embeddings (tied)
            for part, chunk in zip(table[module], tensor.chunk(len(table[module]))):
                tensors[f"model.{part}.{leaf}"] = chunk.contiguous()
    ids = SpecialIds.of(target or tokenizer)
    start = (target or tokenizer).token_to_id(options["decoder_start"]) if options.get("decoder_start") else ids.bos
    values = {
        "model_type": "marian", "architectures": ["MarianMTModel"], "vocab_size": config.vocab_size,
        "decoder_vocab_size": config.vocab_size, "d_model": config.d_model, "encoder_layers": config.n_layers,
        "decoder_layers": depth, "encoder_attention_heads": config.n_heads, "decoder_attention_heads": config.n_heads,
        "encoder_ffn_dim": config.d_ff, "decoder_ffn_dim": config.d_ff,
        "activation_function": SEQ2SEQ_ACTIVATIONS[config.activation], "max_position_embeddings": config.max_len,
        "scale_embedding": config.scale_embedding, "dropout": config.dropout, "attention_dropout": config.attn_dropout,
        "init_std": config.init_std, "pad_token_id": ids.pad, "eos_token_id": ids.eos,
        "forced_eos_token_id": ids.eos, "decoder_start_token_id": start, "share_encoder_decoder_embeddings": True,
        "tie_word_embeddings": True, "is_encoder_decoder": True,
    }
    return write_hf_folder(directory, overwrite, tensors, values, tokenizer, config.max_len, target), "MarianMTModel"


def merged_trunk(pretrained: PretrainedTrunk, task: str) -> dict[str, torch.Tensor]:
    """The trunk's weights with ``task``'s LoRA (or DoRA) written into them (``DeltaRouter.merge``, as ``load(...,
    merge=True)`` does): what the task computes, as plain weights. Adapters and composed deltas do not merge."""
    head = pretrained.heads[task]
    config = DeltaConfig.from_dict(head["meta"]["peft"])
    if config.method != "lora" or config.compose:
        raise ValueError(f"Task '{task}' was trained with a {'composed ' if config.compose else ''}{config.method} "
                         "delta, which does not merge into the trunk's weights, and a transformers folder has no place "
                         "for it: export it as a Trunk task directory (trunk export CKPT DIR --task NAME).")
    trunk = build_trunk(pretrained.config, pretrained.stems)
    trunk.load_state_dict(pretrained.trunk_weights)
    delta, router = TaskDelta(trunk.backbone, config), DeltaRouter()
    delta.load_state_dict({k.removeprefix("delta."): v for k, v in head["state"].items() if k.startswith("delta.")})
    router.add(task, delta)
    router.merge(trunk.backbone, task)
    return {k: v.detach() for k, v in trunk.state_dict().items()}


def pick_head(pretrained: PretrainedTrunk, task: str | None, model_type: str) -> str | None:
    """The task whose head goes into the folder: ``task``, else the only one transformers has a class for (none:
    the trunk alone)."""
    kinds = [*ARCHITECTURES[model_type], "masked_lm"]
    exportable = [t for t, h in pretrained.heads.items() if h["meta"]["kind"] in kinds]
    if task is not None:
        if task not in pretrained.heads:
            raise ValueError(f"--task {task}: the model's tasks are {sorted(pretrained.heads)}.")
        if task not in exportable:
            why = (": ModernBERT's task classes read its head (dense, activation, norm) before the output layer, "
                   "which Trunk's span head has not" if model_type == "modernbert" else "")
            raise ValueError(f"--task {task}: a {pretrained.heads[task]['meta']['kind']} head has no transformers "
                             f"class of the {model_type} family{why}; the kinds that have one are {', '.join(kinds)}.")
        return task
    if len(exportable) > 1:
        raise ValueError(f"The model has several heads transformers can hold ({exportable}), and a folder holds one: "
                         "choose it with --task NAME.")
    return exportable[0] if exportable else None


def check_hf_writable(directory: Path, overwrite: bool) -> None:
    """A new or empty folder, or (with ``overwrite``) a model folder written before: never a user's other files."""
    if not directory.exists():
        return
    if not directory.is_dir():
        raise FileExistsError(f"'{directory}' exists and is not a directory. Choose another output path.")
    contents = sorted(p.name for p in directory.iterdir())
    ours = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", TARGET_TOKENIZER}
    if contents and (not overwrite or set(contents) - ours):
        raise FileExistsError(
            f"'{directory}' is not empty ({contents[:5]}): choose a new or empty directory"
            + (", or pass --overwrite to replace a folder written by --format hf." if set(contents) <= ours else ".")
        )
