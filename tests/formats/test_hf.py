"""Hugging Face checkpoints into the trunk (trunk/formats/hf.py), checked against ``transformers`` itself: tiny random
models of each family built here (no network), saved as ``save_pretrained`` writes them, imported, and compared."""

from __future__ import annotations

import inspect
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import safetensors.torch
import torch

transformers = pytest.importorskip("transformers")

from conftest import single_task  # noqa: E402
from test_pretraining import finetune_args  # noqa: E402

from trunk.cli import export_main, run_cli  # noqa: E402
from trunk.cli.import_model import import_main  # noqa: E402
from trunk.core.codec import PAD, SEP, special_id  # noqa: E402
from trunk.core.contract import TaskSpec  # noqa: E402
from trunk.formats.hf import FAMILIES, convert, map_weights  # noqa: E402
from trunk.formats.trunk_dir import load_pretrained  # noqa: E402
from trunk.models import build_trunk  # noqa: E402
from trunk.tasks.objectives.masked_lm import MaskedLanguageModeling, tied_mlm_head  # noqa: E402

WORDS = ["the", "a", "film", "movie", "is", "was", "good", "bad", "great", "awful", "plot", "actor", ",", ".", "!",
         "and", "but", "not", "very", "quite", "funny", "dull", "story", "ending", "cast", "music"]
SENTENCES = ["the film was great .", "a very dull plot , but the cast is funny !", "awful"]
PAIRS = [("the film was great .", "the plot was not"), ("awful", "a very good story and a great ending ! ! !")]


def write_vocab(folder: Path, pieces: list[str] = ()) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    # BERT's layout: [PAD] 0, unused rows, then [UNK] [CLS] [SEP] [MASK] (ids 100-103 in bert-base's; 6-9 here)
    vocab = ["[PAD]", *[f"[unused{i}]" for i in range(5)], "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS,
             *[f"##{c}" for c in letters], *letters, *",.!", *pieces]
    vocab = list(dict.fromkeys(vocab))  # once each: a WordPiece vocabulary's ids are its line numbers
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    return vocab


TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def write_bpe(folder: Path) -> list[str]:
    """RoBERTa's kind of tokenizer files: a byte-level BPE vocab.json and merges.txt, <s> <pad> </s> <unk> first."""
    from tokenizers.implementations import ByteLevelBPETokenizer

    tokenizer = ByteLevelBPETokenizer()
    tokenizer.train_from_iterator([" ".join(WORDS)] * 4 + SENTENCES, vocab_size=300, min_frequency=1,
                                  special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"], show_progress=False)
    tokenizer.save_model(str(folder))
    return list(tokenizer.get_vocab())


def off_init(model) -> None:
    """LayerNorms and biases moved off their init values (ones, zeros), so a wrong mapping of them shows."""
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(torch.randn_like(p) * 0.1)


def tiny(model_type: str, folder: Path, masked_lm: bool = True, **options):
    """A random ``transformers`` model of ``model_type`` saved to ``folder`` with its family's kind of vocabulary, and
    the model."""
    folder.mkdir(parents=True, exist_ok=True)
    fairseq = model_type in ("roberta", "xlm-roberta", "camembert", "mpnet")
    vocab = write_bpe(folder) if fairseq else write_vocab(folder)
    if fairseq:  # fairseq's ids: padding 1, positions from 2 on
        options = {"pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2, "type_vocab_size": 1,
                   "max_position_embeddings": 66, **options}
    if model_type == "modernbert":  # the special ids of BERT's test vocabulary, not of its own 50k one; 4 blocks
        # (global, local, local, global) with a window of 4 tokens each way, which the test sentences exceed
        options = {"pad_token_id": 0, "cls_token_id": 7, "sep_token_id": 8, "bos_token_id": 7, "eos_token_id": 8,
                   "num_hidden_layers": 4, "local_attention": 8, "global_attn_every_n_layers": 3, **options}
    torch.manual_seed(0)
    if model_type == "distilbert":
        config = transformers.DistilBertConfig(vocab_size=len(vocab), dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                                               max_position_embeddings=64, dropout=0.0, attention_dropout=0.0,
                                               **options)
    else:
        config = transformers.AutoConfig.for_model(model_type, vocab_size=len(vocab), **{**TINY, **options})
    auto = transformers.AutoModelForMaskedLM if masked_lm else transformers.AutoModel
    model = auto.from_config(config).eval()
    off_init(model)
    model.save_pretrained(folder)
    (folder / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    return model


def image_trunk(pretrained):
    """The imported weights in a trunk of their stems (an image model's), for evaluation."""
    trunk = build_trunk(pretrained.config, pretrained.stems)
    trunk.load_state_dict(pretrained.trunk_weights)
    return trunk.eval()


def trunk_of(pretrained):
    trunk = build_trunk(pretrained.config)
    trunk.load_state_dict(pretrained.trunk_weights)
    trunk.stems["text"].separator_id = special_id(pretrained.codec.tokenizer, SEP)  # TrunkModule.connect's job
    return trunk.eval()


def batch(tokenizer, texts):
    """Padded ids, mask and token types as the model's own tokenizer makes them."""
    encodings = [tokenizer.encode(*t) if isinstance(t, tuple) else tokenizer.encode(t) for t in texts]
    length, pad = max(len(e.ids) for e in encodings), special_id(tokenizer, PAD)
    ids = torch.tensor([e.ids + [pad] * (length - len(e.ids)) for e in encodings])
    types = torch.tensor([e.type_ids + [0] * (length - len(e.ids)) for e in encodings])
    return ids, (ids != pad).long(), types


def token_types(model, types) -> dict:
    """``token_type_ids`` where the model takes them (DistilBERT and MPNet do not)."""
    return {"token_type_ids": types} if "token_type_ids" in inspect.signature(model.forward).parameters else {}


def hf_hidden(model, ids, mask, types):
    base = model.base_model
    return base(input_ids=ids, attention_mask=mask, **token_types(base, types)).last_hidden_state


# DeBERTa-v3's settings (deberta-v3-base's config.json): relative positions in log buckets, no absolute positions,
# no token types, the layers' own projections read the position table
DEBERTA_V3 = {"relative_attention": True, "pos_att_type": "p2c|c2p", "share_att_key": True,
              "position_biased_input": False, "norm_rel_ebd": "layer_norm", "type_vocab_size": 0,
              "max_relative_positions": -1, "layer_norm_eps": 1e-7}


@pytest.mark.parametrize("model_type,options", [
    ("bert", {}), ("bert", {"hidden_act": "gelu_new"}), ("distilbert", {}), ("roberta", {}), ("xlm-roberta", {}),
    ("camembert", {}),
    ("electra", {"embedding_size": 16}), ("electra", {}), ("mpnet", {}), ("modernbert", {}),
    # one block applied at both layers; two blocks of two layers each
    ("albert", {"embedding_size": 16}),
    ("albert", {"embedding_size": 16, "num_hidden_layers": 4, "num_hidden_groups": 2}),
    # buckets: 8 each way, logarithmic up to 64 (the batches' pairs reach past 8); exact distances, token types
    ("deberta-v2", {**DEBERTA_V3, "position_buckets": 8}), ("deberta-v2", {**DEBERTA_V3, "legacy": False}),
    ("deberta-v2", {**DEBERTA_V3, "position_buckets": -1, "max_relative_positions": 16, "type_vocab_size": 2}),
], ids=lambda value: value if isinstance(value, str) else ",".join(f"{k}={v}" for k, v in value.items()
                                                                  if k not in DEBERTA_V3 or v != DEBERTA_V3[k]))
def test_hidden_states_and_masked_lm_logits_equal_transformers(model_type, options, tmp_path):
    """fp32, padded batches of single sentences and of pairs: every real position within 1e-5 of transformers, and the
    masked-LM head's logits too."""
    model = tiny(model_type, tmp_path / "hf", **options)
    pretrained, notes = convert(tmp_path / "hf")
    trunk = trunk_of(pretrained)
    head = tied_mlm_head(trunk)
    head.load_state_dict({k.removeprefix("head."): v for k, v in pretrained.heads["mlm"]["state"].items()})
    for texts in (SENTENCES, PAIRS):
        ids, mask, types = batch(pretrained.codec.tokenizer, texts)
        one_segment = (model_type in ("roberta", "xlm-roberta", "camembert", "mpnet", "modernbert")
                       or options.get("type_vocab_size", 2) < 2)
        if texts is PAIRS and not one_segment:
            assert types.any()  # the pairs do carry segment 1, which the trunk reads off [SEP]
        with torch.no_grad():
            expected, ours = hf_hidden(model, ids, mask, types), trunk(ids, mask)
            real = mask.bool()
            assert (expected - ours)[real].abs().max() < 1e-5
            logits = model(input_ids=ids, attention_mask=mask, **token_types(model, types)).logits
            assert (logits - head(ours))[real].abs().max() < 1e-4  # vocabulary logits: larger values
    assert "the pretrained masked-LM head, as task 'mlm'" in notes


def deberta_with_decoder_positions(folder: Path):
    """A tiny DeBERTa-v3 masked-LM saved as DeBERTa's own checkpoints are: with the table of absolute positions its
    enhanced mask decoder reads (``deberta.embeddings.position_embeddings``, which transformers does not load); the
    model and that table."""
    model = tiny("deberta-v2", folder, **{**DEBERTA_V3, "position_buckets": 8, "legacy": False})
    tensors = safetensors.torch.load_file(folder / "model.safetensors")
    table = torch.randn(TINY["max_position_embeddings"], TINY["hidden_size"]) * 0.5
    safetensors.torch.save_file({**tensors, "deberta.embeddings.position_embeddings.weight": table},
                                folder / "model.safetensors", metadata={"format": "pt"})
    return model, table


def enhanced_mask_decoder(model, table, ids, mask):
    """DeBERTa's enhanced mask decoder (``EnhancedMaskDecoder.emd_context_layer`` in microsoft/DeBERTa) on
    transformers' modules: the last layer twice over the layer below it, its queries the absolute positions plus that
    layer's output, then its own first output; the masked-LM head's logits on that."""
    encoder = model.deberta.encoder
    hidden = model.deberta(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[-2]
    query = table[: ids.shape[1]] + hidden
    layer, attention_mask = encoder.layer[-1], encoder.get_attention_mask(mask)
    for _ in range(2):
        query = layer(hidden, attention_mask, query_states=query, relative_pos=encoder.get_rel_pos(hidden),
                      rel_embeddings=encoder.get_rel_embedding())[0]
    return model.lm_predictions(query, model.deberta.embeddings.word_embeddings)


def test_deberta_masked_lm_decodes_with_its_enhanced_mask_decoder_as_deberta_does(tmp_path):
    """A DeBERTa checkpoint with its absolute position table comes in with the masked-LM head decoding as DeBERTa
    pretrained it (the enhanced mask decoder: logits within 1e-4 of the original's maths on transformers' layers,
    padded batches of sentences and pairs); it trains (the table learns); export writes the table back where it was,
    saying transformers' class does not compute it; without the table, the head is the plain one."""
    model, table = deberta_with_decoder_positions(tmp_path / "hf")
    pretrained, notes = convert(tmp_path / "hf")
    meta = pretrained.heads["mlm"]["meta"]
    assert meta["objective"]["init_args"]["enhanced_mask_decoder"] == len(table)
    assert torch.equal(pretrained.heads["mlm"]["state"]["decoder_positions.weight"], table)
    trunk = trunk_of(pretrained)
    objective = MaskedLanguageModeling(enhanced_mask_decoder=len(table))
    objective.build("mlm", trunk, TaskSpec())
    objective.load_state_dict(pretrained.heads["mlm"]["state"], strict=False)
    objective.eval()
    for texts in (SENTENCES, PAIRS):
        ids, mask, _ = batch(pretrained.codec.tokenizer, texts)
        with torch.no_grad():
            expected = enhanced_mask_decoder(model, table, ids, mask)
            plain = model(input_ids=ids, attention_mask=mask).logits
            ours = objective(trunk, {"input_ids": ids, "attention_mask": mask})
        real = mask.bool()
        assert (expected - ours)[real].abs().max() < 1e-4
        assert (plain - ours)[real].abs().max() > 1e-2  # not what transformers' class computes
    objective.train()
    labels = torch.full_like(ids, -100)
    labels[:, 1] = ids[:, 1]
    objective.loss(trunk, {"input_ids": ids, "attention_mask": mask, "labels": labels}, "train").backward()
    assert objective.decoder_positions.weight.grad[1].abs().sum() > 0  # the table learns where it was read
    with pytest.raises(ValueError, match=r"inputs of 80 tokens, and the enhanced mask decoder's position table has "
                                         r"\d+ rows"):
        objective(trunk, {"input_ids": ids.new_ones(1, 80), "attention_mask": mask.new_ones(1, 80)})

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(SENTENCES * 20) + "\n")
    for option in ([], [f"--model.enhanced_mask_decoder={len(table)}"]):  # domain-adaptive pretraining from that head
        args = single_task(["--model=trunk.tasks.MaskedLanguageModeling", f"--model.init_from={tmp_path / 'hf'}",
                            *option, "--data=trunk.datamodules.CorpusData", f"--data.train={corpus}",
                            "--data.max_length=32", "--data.batch_size=8", "--trainer.max_steps=2",
                            "--trainer.accelerator=cpu", "--trainer.enable_progress_bar=false",
                            f"--trainer.default_root_dir={tmp_path / 'run'}"], "mlm")
        if not option:
            with pytest.raises(ValueError, match=r"built with \{'enhanced_mask_decoder': 64\}: give the task"):
                run_cli(args, run=False)
            continue
        cli = run_cli(args, run=False)
        assert torch.equal(cli.model.objectives["mlm"].decoder_positions.weight, table)
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
        assert torch.isfinite(cli.trainer.callback_metrics["train/loss"])

    import_main([str(tmp_path / "hf"), str(tmp_path / "trunk")])
    with pytest.warns(UserWarning, match="enhanced mask decoder, which transformers' DebertaV2ForMaskedLM does not "):
        export_main([str(tmp_path / "trunk"), str(tmp_path / "out"), "--format", "hf"])
    assert torch.equal(safetensors.torch.load_file(tmp_path / "out" / "model.safetensors")[
        "deberta.embeddings.position_embeddings.weight"], table)
    again, _ = convert(tmp_path / "out")
    assert torch.equal(again.heads["mlm"]["state"]["decoder_positions.weight"], table)

    tiny("deberta-v2", tmp_path / "plain", **{**DEBERTA_V3, "position_buckets": 8})  # as transformers saves it
    plain, _ = convert(tmp_path / "plain")
    assert plain.heads["mlm"]["meta"]["objective"]["init_args"]["enhanced_mask_decoder"] == 0
    base, _ = deberta_with_decoder_positions(tmp_path / "base")  # the table without a head to decode with: left out
    tensors = safetensors.torch.load_file(tmp_path / "base" / "model.safetensors")
    safetensors.torch.save_file({k: v for k, v in tensors.items() if not k.startswith("lm_predictions.")},
                                tmp_path / "base" / "model.safetensors", metadata={"format": "pt"})
    assert convert(tmp_path / "base")[0].heads == {}


def test_base_model_without_a_head_imports_with_its_pooler(tmp_path):
    model = tiny("bert", tmp_path / "hf", masked_lm=False)
    pretrained, notes = convert(tmp_path / "hf")
    assert pretrained.heads == {}
    assert torch.equal(pretrained.pooler["weight"], model.pooler.dense.weight)
    assert any("pooler" in note for note in notes)


def test_tokenizer_file_settings_that_would_corrupt_a_run_are_cleared(tmp_path):
    """A tokenizer.json that pads every input to a fixed length (as the shipped MiniLM's does) is read without it."""
    from tokenizers.implementations import BertWordPieceTokenizer

    tiny("bert", tmp_path / "hf")
    tokenizer = BertWordPieceTokenizer(str(tmp_path / "hf" / "vocab.txt"), lowercase=True)._tokenizer
    tokenizer.enable_padding(length=40)
    tokenizer.enable_truncation(40)
    tokenizer.save(str(tmp_path / "hf" / "tokenizer.json"))
    pretrained, notes = convert(tmp_path / "hf")
    assert len(pretrained.codec.tokenizer.encode("the film").ids) == 4  # [CLS] the film [SEP], not 40
    assert any("padding to 40" in note and "truncation at 40" in note for note in notes)


def saved(model) -> dict[str, torch.Tensor]:
    """A model's weights under the names ``save_pretrained`` writes (transformers 5 renames some modules in memory)."""
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # transformers 4: the names in memory are the file's
        return model.state_dict()
    return revert_weight_conversion(model, model.state_dict())


def test_real_size_configs_map_on_the_meta_device():
    """BERT-base, DistilBERT-base, ELECTRA-small's discriminator and generator, RoBERTa-base, MPNet-base: every weight
    of a transformers model of that size maps, none is left over, without allocating any."""
    configs = {
        "bert": transformers.BertConfig(),
        "distilbert": transformers.DistilBertConfig(),
        "electra": transformers.ElectraConfig(),  # ELECTRA-small: embeddings 128 wide, projected to 256
        "roberta": transformers.RobertaConfig(vocab_size=50265, max_position_embeddings=514, type_vocab_size=1),
        "mpnet": transformers.MPNetConfig(),  # mpnet-base (all-mpnet-base-v2's shape)
        "albert": transformers.AlbertConfig(vocab_size=30000, embedding_size=128, hidden_size=768,  # albert-base-v2
                                            num_attention_heads=12, intermediate_size=3072),
    }
    for model_type, config in configs.items():
        with torch.device("meta"):
            model = transformers.AutoModelForMaskedLM.from_config(config)
        mapped = map_weights(config.to_dict(), saved(model), model_type)
        ours = sum(v.numel() for v in mapped.trunk.values()) + sum(
            v.numel() for k, v in mapped.heads["mlm"]["state"].items() if k != "head.decoder.weight"
        )
        theirs = sum(p.numel() for p in model.parameters())
        assert ours == theirs, model_type
    assert set(configs) <= set(FAMILIES)
    with torch.device("meta"):  # ELECTRA-small's discriminator: its replaced-token head as the task electra
        electra = transformers.ElectraForPreTraining(transformers.ElectraConfig())
    mapped = map_weights(electra.config.to_dict(), saved(electra), "electra")
    ours = [*mapped.trunk.values(), *mapped.heads["electra"]["state"].values()]
    assert sum(v.numel() for v in ours) == sum(p.numel() for p in electra.parameters())
    with torch.device("meta"):
        vit = transformers.ViTModel(transformers.ViTConfig())  # ViT-B/16 at 224
    with torch.device("meta"):
        bart = transformers.BartForConditionalGeneration(transformers.BartConfig())  # bart-large's shape
    mapped = map_weights(bart.config.to_dict(), saved(bart), "bart")
    decoder = mapped.heads["translation"]["state"]
    ours = sum(v.numel() for v in mapped.trunk.values()) + sum(
        v.numel() for k, v in decoder.items() if k != "decoder.stem.token.weight"
    )
    assert ours == sum(p.numel() for p in bart.parameters()) + bart.final_logits_bias.numel()  # a buffer there
    with torch.device("meta"):
        t5 = transformers.T5ForConditionalGeneration(transformers.T5Config(d_model=768, d_kv=64, d_ff=3072,
                                                                           num_layers=12, num_heads=12))  # t5-base
    mapped = map_weights(t5.config.to_dict(), saved(t5), "t5")
    decoder = mapped.heads["translation"]["state"]
    ours = sum(v.numel() for v in mapped.trunk.values()) + sum(
        v.numel() for k, v in decoder.items() if k != "decoder.stem.token.weight")
    biases = sum(p.shape[0] for n, p in t5.named_parameters() if re.search(r"\.(q|k|v|o|wi|wo)\.weight$", n))
    assert ours == sum(p.numel() for p in t5.parameters()) + biases + t5.config.vocab_size  # zero biases, output bias
    mapped = map_weights(vit.config.to_dict(), saved(vit), "vit")
    pooler = sum(p.numel() for p in vit.pooler.parameters())
    # [CLS]'s position row is folded into [CLS]
    assert sum(v.numel() for v in mapped.trunk.values()) == sum(p.numel() for p in vit.parameters()) - pooler - 768


@pytest.mark.parametrize("name,shape", [
    ("deberta-v3-base", {}), ("deberta-v3-large", dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                                                       intermediate_size=4096)),
    ("mdeberta-v3-base", dict(vocab_size=251000)),
])
def test_deberta_v3_real_sizes_map_on_the_meta_device(name, shape):
    """Every weight of DeBERTa-v3 base / large and mDeBERTa-v3 base (and the masked-LM head) maps, none is left over."""
    config = transformers.DebertaV2Config(**{"vocab_size": 128100, "position_buckets": 256, **DEBERTA_V3, **shape})
    with torch.device("meta"):
        model = transformers.DebertaV2ForMaskedLM(config)
    mapped = map_weights(config.to_dict(), saved(model), name)
    ours = sum(v.numel() for v in mapped.trunk.values()) + sum(
        v.numel() for k, v in mapped.heads["mlm"]["state"].items() if k != "head.decoder.weight")
    assert ours == sum(p.numel() for p in model.parameters())
    assert mapped.config.relative_buckets == 512 and mapped.config.relative_max_distance == 512


@pytest.mark.parametrize("name,shape", [
    ("ModernBERT-base", dict(hidden_size=768, num_hidden_layers=22, num_attention_heads=12, intermediate_size=1152)),
    ("ModernBERT-large", dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, intermediate_size=2624)),
])
def test_modernbert_real_sizes_map_on_the_meta_device(name, shape):
    """Every weight of ModernBERT base / large with its masked-LM head maps, bias-free (a zero bias for the head's dense
    layer only); every third block global with rope base 160,000, the others within 64 tokens with 10,000."""
    config = transformers.ModernBertConfig(vocab_size=50368, **shape)
    with torch.device("meta"):
        model = transformers.ModernBertForMaskedLM(config)
    mapped = map_weights(config.to_dict(), saved(model), name)
    ours = {**mapped.trunk, **{k: v for k, v in mapped.heads["mlm"]["state"].items() if k != "head.decoder.weight"}}
    added = sum(v.numel() for k, v in ours.items() if k.endswith("bias") and k != "head.decoder.bias")  # all zero
    assert added == shape["hidden_size"] and not mapped.config.bias
    assert sum(v.numel() for v in ours.values()) - added == sum(p.numel() for p in model.parameters())
    c = mapped.config
    assert (c.local_window, c.global_every, c.rope_base, c.rope_base_local, c.first_block_norm) == (
        64, 3, 160000.0, 10000.0, False)


def test_a_task_built_on_a_modernbert_folder_keeps_its_local_blocks_and_rope_bases(tmp_path):
    """A fine-tuning run from the folder takes how the trunk attended (every third block global, the others within 4
    tokens, their rope bases, no norm before the first block's attention), so its trunk still computes transformers'
    hidden states; a run may still choose other attention itself."""
    from trunk.assembly.weights import from_pretrained
    from trunk.tasks import SequenceClassification

    model = tiny("modernbert", tmp_path / "hf", masked_lm=False)
    task = {"s": SequenceClassification()}
    built = from_pretrained(tmp_path / "hf", task, task_info={"s": {"label_names": ["a", "b"]}}).eval()
    built.trunk.stems["text"].separator_id = 8
    ids, mask, _ = batch(convert(tmp_path / "hf")[0].codec.tokenizer, SENTENCES)
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask).last_hidden_state
        assert (built.trunk(ids, mask) - expected)[mask.bool()].abs().max() < 1e-5
    full = from_pretrained(tmp_path / "hf", task, task_info={"s": {"label_names": ["a", "b"]}},
                           trunk={"local_window": 16})
    assert full.trunk_config.local_window == 16 and full.trunk_config.global_every == 3


def test_a_modernbert_with_scaled_rotary_positions_is_refused_by_name(tmp_path):
    tiny("modernbert", tmp_path / "hf", masked_lm=False)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config["rope_parameters"]["full_attention"].update(rope_type="yarn", factor=4.0)
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"modernbert checkpoint scales its rotary positions \(\['full_attention'\]"):
        convert(tmp_path / "hf")


@pytest.mark.parametrize("change", [{"conv_kernel_size": 3}, {"share_att_key": False}, {"position_biased_input": True},
                                    {"pos_att_type": ["c2p"]}, {"norm_rel_ebd": "none"}])
def test_a_deberta_option_the_trunk_cannot_compute_is_refused_by_name(change, tmp_path):
    """DeBERTa-v2's convolution beside the first layer, separate position projections, absolute positions at the input,
    one of the two position terms alone, an unnormalised position table: each named before any weight is read."""
    tiny("deberta-v2", tmp_path / "hf", masked_lm=False, **{**DEBERTA_V3, **change})
    name, value = next(iter(change.items()))
    with pytest.raises(ValueError, match=re.escape(f"deberta-v2 checkpoint has {name}={value!r}, which the trunk")):
        convert(tmp_path / "hf")


def test_a_trunk_directory_written_by_import_fine_tunes_and_carries_the_mlm_head(tmp_path):
    tiny("bert", tmp_path / "hf")
    out = subprocess.run([sys.executable, "-m", "trunk.cli", "import", str(tmp_path / "hf"), str(tmp_path / "trunk")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Wrote" in out.stdout and "masked-LM head" in out.stdout
    assert f"Imported from `{tmp_path / 'hf'}`" in (tmp_path / "trunk" / "README.md").read_text()
    pretrained = load_pretrained(tmp_path / "trunk")
    assert pretrained.config.segments == 2 and list(pretrained.heads) == ["mlm"]  # BertForMaskedLM has no pooler
    # the same weights as read straight from the folder
    direct, _ = convert(tmp_path / "hf")
    assert all(torch.equal(direct.trunk_weights[k], v) for k, v in pretrained.trunk_weights.items())


@pytest.mark.parametrize("change,message", [
    (lambda cfg, folder: cfg.update(model_type="xlnet"), "xlnet model, which Trunk cannot import: XLNet is a"),
    (lambda cfg, folder: cfg.update(model_type="albert", embedding_size=16, inner_group_num=2),
     "albert checkpoint has inner_group_num=2, which the trunk cannot compute"),
    (lambda cfg, folder: cfg.update(model_type="albert", embedding_size=32),
     "albert checkpoint has embedding_size=hidden_size=32, and projects its embeddings between the two equal widths"),
    (lambda cfg, folder: cfg.update(model_type="gpt-neo"), "'gpt-neo' model; Trunk imports the model types bert"),
    (lambda cfg, folder: cfg.update(position_embedding_type="relative_key"), "position_embedding_type='relative_key'"),
    (lambda cfg, folder: cfg.update(hidden_act="mish"), "activation .mish. is not one the trunk has"),
    (lambda cfg, folder: cfg.update(num_hidden_layers=3), r"missing \['bert.encoder.layer.2"),
    (lambda cfg, folder: cfg.update(num_hidden_layers=1), r"unexpected \['bert.encoder.layer.1"),
    # ten million blocks are never built (the import used to build them on the meta device for hours)
    (lambda cfg, folder: cfg.update(num_hidden_layers=10**7), r"gives 10000000 blocks: its weights hold 2, missing"),
    (lambda cfg, folder: cfg.update(vocab_size=cfg["vocab_size"] + 1), "does not match its config.json"),
    (lambda cfg, folder: (folder / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nx"),
     "The tokenizer has 6 tokens, but .* rows in its embedding table"),
    (lambda cfg, folder: (folder / "model.safetensors").unlink(), "holds no weights"),
    (lambda cfg, folder: (folder / "tokenizer_config.json").write_text("{do_lower_case"), "is not valid JSON"),
    (lambda cfg, folder: (folder / "model.safetensors").write_bytes(b"\x00" * 64), "corrupted or not a weights file"),
])
def test_bad_checkpoints_are_one_clear_error_and_nothing_is_written(change, message, tmp_path):
    tiny("bert", tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    change(config, tmp_path / "hf")
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    with pytest.raises(SystemExit) as exit_info:
        import_main([str(tmp_path / "hf"), str(tmp_path / "trunk")])
    said = str(exit_info.value.code)
    assert said.startswith("error: ") and len(said.splitlines()) == 1, said
    assert re.search(message, said), said
    assert not (tmp_path / "trunk").exists() and not list(tmp_path.glob(".trunk*"))


def test_pickled_weights_load_with_weights_only(tmp_path):
    """pytorch_model.bin is read with weights_only=True: the same weights as safetensors, and a pickle that would run
    code is refused, not run."""
    model = tiny("bert", tmp_path / "hf")
    (tmp_path / "hf" / "model.safetensors").unlink()
    torch.save(model.state_dict(), tmp_path / "hf" / "pytorch_model.bin")
    pretrained, _ = convert(tmp_path / "hf")
    embeddings = model.bert.embeddings.word_embeddings.weight
    assert torch.equal(pretrained.trunk_weights["stems.text.token.weight"], embeddings)

    class Evil:
        def __reduce__(self):
            return (Path.touch, (tmp_path / "ran",))

    torch.save({"x": Evil()}, tmp_path / "hf" / "pytorch_model.bin")
    with pytest.raises(ValueError, match="holds more than tensors .* refused"):
        convert(tmp_path / "hf")
    assert not (tmp_path / "ran").exists()
    # torch.save's legacy (non-zip) format, which cannot be memory-mapped, is fine: read whole, not called corrupted
    torch.save(model.state_dict(), tmp_path / "hf" / "pytorch_model.bin", _use_new_zipfile_serialization=False)
    pretrained, _ = convert(tmp_path / "hf")
    assert torch.equal(pretrained.trunk_weights["stems.text.token.weight"], embeddings)


@pytest.mark.parametrize("model_type, task_class", [
    ("bert", "AutoModelForSequenceClassification"), ("roberta", "AutoModelForSequenceClassification"),
    ("distilbert", "AutoModelForSequenceClassification"), ("electra", "AutoModelForTokenClassification"),
    ("bert", "AutoModelForQuestionAnswering"), ("albert", "AutoModelForMultipleChoice"),
])
def test_a_fine_tuned_task_model_reads_as_its_base_model_and_says_its_head_is_not_read(model_type, task_class,
                                                                                       tmp_path):
    """Hub classifiers (a BERT fine-tuned on SST-2, say) are common starting points: their base model is read as the
    trunk, and their task head (classifier, qa_outputs), which a run's tasks replace, is named in a note, not refused
    as an unexpected weight."""
    base = tiny(model_type, tmp_path / "hf", masked_lm=False)
    trunk, _ = convert(tmp_path / "hf")
    labels = {"id2label": {0: "NEGATIVE", 1: "POSITIVE"}} if "Sequence" in task_class else {}
    task = getattr(transformers, task_class).from_config(base.config.__class__(**{**base.config.to_dict(), **labels}))
    getattr(task, task.base_model_prefix).load_state_dict(base.state_dict(), strict=False)  # some have no pooler
    task.save_pretrained(tmp_path / "hf")
    read, notes = convert(tmp_path / "hf")
    assert all(torch.equal(read.trunk_weights[k], v) for k, v in trunk.trunk_weights.items())
    head = "qa_outputs" if "Question" in task_class else "classifier, pre_classifier" if model_type == "distilbert" \
        else "classifier"
    said = f"not its fine-tuned task head ({head}{'; labels' if labels else ')'}"
    assert any(said in note for note in notes), notes
    if labels:
        assert any("labels ['NEGATIVE', 'POSITIVE']): each task of a run trains a head of its own" in n for n in notes)


@pytest.mark.parametrize("kind", ["safetensors", "pickle"])
def test_sharded_weights_read_as_the_whole_file(kind, tmp_path):
    """Large models ship their weights in shards with an index (model.safetensors.index.json, or older ones
    pytorch_model.bin.index.json): read as the one file they stand for; a shard missing is named."""
    tiny("bert", tmp_path / "hf")
    whole, _ = convert(tmp_path / "hf")
    tensors = safetensors.torch.load_file(str(tmp_path / "hf" / "model.safetensors"))
    (tmp_path / "hf" / "model.safetensors").unlink()
    names, stem, suffix = sorted(tensors), ("model" if kind == "safetensors" else "pytorch_model"), \
        (".safetensors" if kind == "safetensors" else ".bin")
    shards = {f"{stem}-0000{i + 1}-of-00002{suffix}": names[i::2] for i in range(2)}
    for file, keys in shards.items():
        part = {k: tensors[k] for k in keys}
        if kind == "safetensors":
            safetensors.torch.save_file(part, str(tmp_path / "hf" / file))
        else:
            torch.save(part, tmp_path / "hf" / file)
    index = tmp_path / "hf" / f"{stem}{suffix}.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": {k: f for f, keys in shards.items() for k in keys}}))
    sharded, _ = convert(tmp_path / "hf")
    assert sharded.trunk_weights.keys() == whole.trunk_weights.keys()
    assert all(torch.equal(sharded.trunk_weights[k], v) for k, v in whole.trunk_weights.items())
    (tmp_path / "hf" / next(iter(shards))).unlink()
    with pytest.raises(FileNotFoundError, match=rf"index.json' lists 1 shard\(s\) not in its folder \({stem}-00001-of"
                                                r"-00002.*\): download every shard of the model."):
        convert(tmp_path / "hf")


def test_a_folder_under_the_home_directory_is_given_with_a_tilde(sentiment_files, tmp_path, monkeypatch):
    """``model.init_from: ~/models/x``: read as the data's paths are, from the home directory."""
    monkeypatch.setenv("HOME", str(tmp_path))
    model = tiny("bert", tmp_path / "models" / "hf", masked_lm=False)
    cli = run_cli(finetune_args("~/models/hf/", sentiment_files, tmp_path / "run"), run=False)
    assert torch.equal(cli.model.trunk.stems["text"].segment.weight, model.embeddings.token_type_embeddings.weight)


def test_fine_tuning_from_a_folder_reads_segments_off_its_sep_and_starts_from_its_pooler(sentiment_files, tmp_path):
    model = tiny("bert", tmp_path / "hf", masked_lm=False)
    cli = run_cli(finetune_args(tmp_path / "hf", sentiment_files, tmp_path / "run"), run=False)
    trunk = cli.model.trunk
    assert trunk.stems["text"].separator_id == 8  # this vocabulary's [SEP], not Trunk's own 3
    assert torch.equal(trunk.stems["text"].segment.weight, model.embeddings.token_type_embeddings.weight)
    head = cli.model.objectives["sentiment"].head
    assert torch.equal(head.dense.weight, model.pooler.dense.weight)  # the pretrained pooler
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert torch.isfinite(cli.trainer.callback_metrics["train/loss"])


def discriminator(model_type: str, folder: Path):
    """A tiny random discriminator saved to ``folder``: ELECTRA's (``ElectraForPreTraining``), or a DeBERTa-v3 model
    with its replaced-token head (``mask_predictions``: dense, LayerNorm, classifier; no transformers class has it);
    returns the model and a function of (ids, mask) giving its replaced-token logits as their own code computes them."""
    import safetensors.torch as st

    if model_type == "electra":
        folder.mkdir(parents=True)
        config = transformers.ElectraConfig(vocab_size=len(write_vocab(folder)), embedding_size=16, **TINY)
        torch.manual_seed(0)
        model = transformers.ElectraForPreTraining(config).eval()
        off_init(model)
        model.save_pretrained(folder)
        return model, lambda ids, mask: model(input_ids=ids, attention_mask=mask).logits
    model = tiny("deberta-v2", folder, masked_lm=False, **DEBERTA_V3)
    width = model.config.hidden_size
    head = {"dense": torch.nn.Linear(width, width), "LayerNorm": torch.nn.LayerNorm(width, eps=1e-7),
            "classifier": torch.nn.Linear(width, 1)}
    off_init(torch.nn.ModuleDict(head))
    tensors = st.load_file(folder / "model.safetensors")
    tensors.update({f"mask_predictions.{name}.{k}": v.detach() for name, part in head.items()
                    for k, v in part.state_dict().items()})
    st.save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})

    def logits(ids, mask):  # the DeBERTa repository's LMMaskPredictionHead
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
        states = head["LayerNorm"](hidden[:, :1] + hidden)
        return head["classifier"](torch.nn.functional.gelu(head["dense"](states))).squeeze(-1)

    return model, logits


@pytest.mark.parametrize("model_type", ["electra", "deberta-v2"])
def test_a_discriminator_comes_in_as_the_electra_task_and_goes_on_training(model_type, tmp_path):
    """ELECTRA's and DeBERTa-v3's discriminators: their replaced-token heads come in as the task ``electra`` and give
    their logits within 1e-5 on padded batches; ReplacedTokenDetection named electra goes on training from them (the
    same head weights at its start, DeBERTa's with cls_context), its generator fresh."""
    from trunk.models import ReplacedTokenHead
    from trunk.models.trunk import norm_layer

    _, reference = discriminator(model_type, tmp_path / "hf")
    pretrained, notes = convert(tmp_path / "hf")
    assert "the pretrained replaced-token detection head, as task 'electra'" in notes
    cls_context = model_type == "deberta-v2"
    assert pretrained.heads["electra"]["meta"]["objective"]["init_args"]["cls_context"] is cls_context
    trunk = trunk_of(pretrained)
    head = ReplacedTokenHead(32, "gelu", norm=norm_layer(pretrained.config) if cls_context else None).eval()
    head.load_state_dict({k.removeprefix("head."): v for k, v in pretrained.heads["electra"]["state"].items()})
    ids, mask, _ = batch(pretrained.codec.tokenizer, SENTENCES)
    with torch.no_grad():
        assert (reference(ids, mask) - head(trunk(ids, mask)))[mask.bool()].abs().max() < 1e-5
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(SENTENCES * 50) + "\n")
    args = single_task(["--model=trunk.tasks.ReplacedTokenDetection", f"--model.init_from={tmp_path / 'hf'}",
                        f"--model.cls_context={str(cls_context).lower()}", "--data=trunk.datamodules.CorpusData",
                        f"--data.train={corpus}", "--data.max_length=32", "--data.batch_size=8",
                        "--trainer.max_steps=2", "--trainer.accelerator=cpu", "--trainer.enable_progress_bar=false",
                        f"--trainer.default_root_dir={tmp_path / 'run'}"], "electra")
    cli = run_cli(args, run=False)
    started, stored = cli.model.objectives["electra"].head.state_dict(), pretrained.heads["electra"]["state"]
    assert all(torch.equal(v, started[k.removeprefix("head.")]) for k, v in stored.items())
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert torch.isfinite(cli.trainer.callback_metrics["train/loss"])


def test_masked_lm_goes_on_pretraining_from_the_imported_head(tmp_path):
    """Domain-adaptive pretraining: MaskedLanguageModeling on the user's text starts from RoBERTa's own head, its
    special tokens spelt <s> </s> <pad> <mask>."""
    model = tiny("roberta", tmp_path / "hf")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(SENTENCES * 50) + "\n")
    args = single_task(["fit", "--model=trunk.tasks.MaskedLanguageModeling", f"--model.init_from={tmp_path / 'hf'}",
                        "--data=trunk.datamodules.CorpusData", f"--data.train={corpus}", "--data.max_length=32",
                        "--data.batch_size=8", "--trainer.max_steps=3", "--trainer.accelerator=cpu",
                        "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
                        f"--trainer.default_root_dir={tmp_path / 'run'}"], "mlm")
    cli = run_cli(args[1:], run=False)
    head = cli.model.objectives["mlm"].head
    assert torch.equal(head.dense.weight, model.lm_head.dense.weight)
    assert torch.equal(head.decoder.bias, model.lm_head.bias)
    assert head.decoder.weight is cli.model.trunk.stems["text"].token.weight  # still tied
    batch = next(iter(cli.datamodule.train_dataloader()))
    tokenizer = cli.datamodule.tokenizer
    assert (batch["input_ids"][:, 0] == tokenizer.token_to_id("<s>")).all()
    assert (batch["input_ids"] == tokenizer.token_to_id("<mask>")).any()
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert torch.isfinite(cli.trainer.callback_metrics["train/loss"])


MODERNBERT_BIASES = {"attention_bias": True, "mlp_bias": True, "norm_bias": True, "classifier_bias": True}


@pytest.mark.parametrize("model_type,options", [
    ("bert", {}), ("roberta", {}), ("electra", {"embedding_size": 16}),
    ("deberta-v2", {**DEBERTA_V3, "position_buckets": 8}), ("modernbert", {}), ("modernbert", MODERNBERT_BIASES),
    ("albert", {"embedding_size": 16, "num_hidden_layers": 4, "num_hidden_groups": 2})],
    ids=["bert", "roberta", "electra", "deberta-v2", "modernbert", "modernbert-with-biases", "albert"])
def test_import_then_export_gives_transformers_the_same_model(model_type, options, tmp_path):
    """import -> export --format hf -> transformers: every weight equal to the original's (none missing, none added),
    and the same logits."""
    model = tiny(model_type, tmp_path / "hf", **options)
    import_main([str(tmp_path / "hf"), str(tmp_path / "trunk")])
    export_main([str(tmp_path / "trunk"), str(tmp_path / "out"), "--format", "hf"])
    back = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "out").eval()
    assert type(back) is type(model)
    original = model.state_dict()
    for name, tensor in back.state_dict().items():
        if name in original:
            assert torch.equal(tensor, original[name]), name
    if model_type == "modernbert":  # the model's own layout whole: its fused projections, no bias it lacks
        written = set(safetensors.torch.load_file(tmp_path / "out" / "model.safetensors"))
        biased = {k for k in written if k.endswith(".bias") and "layers." in k}
        assert written - {"decoder.weight"} == set(saved(model)) - {"decoder.weight"}
        assert bool(biased) == ("mlp_bias" in options)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    ids = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    assert ids["input_ids"][0, 0] == special_id(convert(tmp_path / "hf")[0].codec.tokenizer, "[CLS]")
    with torch.no_grad():
        assert torch.allclose(back(**ids).logits, model(**ids).logits, atol=1e-5)


@pytest.mark.parametrize("model_type,peft", [("bert", None), ("bert", "{sentiment: {method: lora, r: 4, norms: true}}"),
                                             ("deberta-v2", None), ("modernbert", None),
                                             ("modernbert", "{sentiment: {method: lora, r: 4, norms: true}}"),
                                             ("albert", "{sentiment: {method: lora, r: 4, norms: true}}")],
                         ids=["full", "lora", "deberta-v3", "modernbert", "modernbert-lora", "albert-lora"])
def test_a_classifier_fine_tuned_here_loads_in_transformers_and_gives_its_logits(model_type, peft, sentiment_files,
                                                                                 tmp_path):
    """Fully fine-tuned, or with a LoRA delta on the frozen trunk (written into the trunk's weights on export); from
    BERT, from DeBERTa-v3 (its context pooler given the head's tanh) and from ModernBERT (its head: the pooler with
    the trunk's bias-free norm after it, ``pooler_norm``; mean pooling as its ``classifier_pooling``); from ALBERT with
    a LoRA on its one shared block (one delta, applied at every layer, merged once)."""
    from trunk.inference.predictor import load

    options = {"deberta-v2": DEBERTA_V3, "albert": {"embedding_size": 16}}.get(model_type, {})
    tiny(model_type, tmp_path / "hf", masked_lm=False, **options)
    extra = [f"--model.peft={peft}", "--model.optimizer.lr=0.01"] if peft else []
    head = ["--model.pooler_norm=true", "--model.pooling=mean"] if model_type == "modernbert" else []
    cli = run_cli(["fit", *finetune_args(tmp_path / "hf", sentiment_files, tmp_path / "run", *head), *extra])
    if model_type == "modernbert":  # bias-free as the weights it started from, LoRA's norm shifts included
        assert not [n for n, _ in cli.model.named_parameters() if n.endswith("bias") and "blocks" in n]
    ckpt = cli.trainer.checkpoint_callback.last_model_path or cli.trainer.checkpoint_callback.best_model_path
    export_main([ckpt, str(tmp_path / "out"), "--format", "hf"])
    model = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "out").eval()
    assert model.config.id2label == {0: "negative", 1: "positive"}
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    texts = ["the film was great", "a dull plot and an awful ending"]
    with torch.no_grad():
        logits = model(**tokenizer(texts, padding=True, return_tensors="pt")).logits
    records = load(ckpt, precision="32-true").predict(texts)
    probs = torch.tensor([[r["probs"]["negative"], r["probs"]["positive"]] for r in records])
    assert torch.allclose(logits.softmax(-1), probs, atol=1e-5)


def test_export_refuses_what_transformers_cannot_compute(tmp_path, tiny_trunk_dir):
    with pytest.raises(SystemExit, match=r"error: --format hf writes BERT-family, DeBERTa-v2 and ModernBERT models, "
                                         r"and this trunk has embedding_norm=False \(ModernBERT: True\), "
                                         r"gated_ff=False \(ModernBERT: True\), first_block_norm=True "
                                         r"\(ModernBERT: False\)"):
        export_main([str(tiny_trunk_dir), str(tmp_path / "out"), "--format", "hf"])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("change,message", [
    ({"gated_ff": True}, r"gated_ff=True \(BERT: False\)"), ({"rms_norm": True}, r"rms_norm=True \(BERT: False\)"),
    ({"bias": False}, r"bias=False \(BERT: True\)"),
    ({"shared_blocks": 1}, r"embedding_size=16 \(ALBERT projects its embeddings up: below d_model\)")])
def test_export_refuses_a_bert_shaped_trunk_with_a_part_bert_lacks(change, message, tmp_path):
    """A trunk of BERT's shape but for one part (a gated feed-forward, RMSNorm, no biases; shared blocks without
    ALBERT's narrower embedding) is refused by that part's name, not written with the part dropped."""
    from trunk.core.codec import Codec
    from trunk.datamodules.tokenizer import train_wordpiece
    from trunk.formats.trunk_dir import PretrainedTrunk, save_pretrained
    from trunk.models import TrunkConfig

    tokenizer = train_wordpiece(SENTENCES, vocab_size=60)
    config = TrunkConfig(vocab_size=tokenizer.get_vocab_size(), d_model=16, n_layers=1, n_heads=2, d_ff=32, max_len=16,
                         positions="learned", norm="post", **change)
    trunk = PretrainedTrunk(tmp_path, config, {"text": {}}, build_trunk(config).state_dict(), codec=Codec(tokenizer))
    save_pretrained(tmp_path / "trunk", trunk)
    with pytest.raises(SystemExit, match=message):
        export_main([str(tmp_path / "trunk"), str(tmp_path / "out"), "--format", "hf"])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("objective,data,files,architecture,length", [
    ("TokenClassification", "TokenClassificationData", "ner_files", "ForTokenClassification", 32),
    ("ExtractiveQuestionAnswering", "QuestionAnsweringData", "squad_files", "ForQuestionAnswering", 96)])
def test_a_modernbert_token_or_span_head_goes_back_with_its_head_norm_and_is_refused_without(
        objective, data, files, architecture, length, request, tmp_path):
    """ModernBERT's token classifier and QA model read its head (dense, activation, norm) before the output layer: a
    token or span head trained with head_norm goes out as ModernBertFor... with the same logits; one without is
    refused naming the option, nothing written."""
    files = request.getfixturevalue(files)
    tiny("modernbert", tmp_path / "hf", masked_lm=False)
    checkpoints = {}
    for head_norm in (False, True):
        cli = run_cli(["fit", *single_task([
            f"--model=trunk.tasks.{objective}", f"--model.init_from={tmp_path / 'hf'}",
            f"--model.head_norm={str(head_norm).lower()}", f"--data=trunk.datamodules.{data}",
            f"--data.train={files['train']}", f"--data.max_length={length}", "--trainer.max_steps=1",
            "--trainer.accelerator=cpu", "--trainer.enable_progress_bar=false",
            f"--trainer.default_root_dir={tmp_path / f'run{head_norm}'}"], "task")])
        callback = cli.trainer.checkpoint_callback
        checkpoints[head_norm] = (cli.model.eval(), callback.last_model_path or callback.best_model_path)
    with pytest.raises(SystemExit, match=rf"Task 'task' has head_norm=False; transformers' "
                                         rf"ModernBert{architecture} computes head_norm: true"):
        export_main([checkpoints[False][1], str(tmp_path / "refused"), "--format", "hf"])
    assert not (tmp_path / "refused").exists()
    model, ckpt = checkpoints[True]
    export_main([ckpt, str(tmp_path / "out"), "--format", "hf"])
    assert json.loads((tmp_path / "out" / "config.json").read_text())["architectures"] == [f"ModernBert{architecture}"]
    theirs = getattr(transformers, f"AutoModel{architecture}").from_pretrained(tmp_path / "out").eval()
    ids = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        ours = model.objectives["task"].head(model.trunk(ids["input_ids"], ids["attention_mask"]))
        output = theirs(**ids)
        logits = (torch.stack([output.start_logits, output.end_logits], -1) if architecture == "ForQuestionAnswering"
                  else output.logits)
        real = ids["attention_mask"].bool()
        assert (logits - ours)[real].abs().max() < 1e-5


def tiny_vit(folder: Path, **options):
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    shape = {k: v for k, v in TINY.items() if k != "max_position_embeddings"}  # a ViT's positions are its patches'
    config = transformers.ViTConfig(image_size=32, patch_size=8, num_channels=3, **shape, **options)
    model = transformers.ViTModel(config).eval()
    off_init(model)
    model.save_pretrained(folder)
    (folder / "preprocessor_config.json").write_text(json.dumps({"image_mean": [0.5] * 3, "image_std": [0.5] * 3}))
    return model


def test_vit_outputs_equal_transformers_at_its_size_and_at_another(tmp_path):
    """ViT: [CLS]'s position row folded into [CLS], the patch table as the stem's; a larger image reads the table
    resized as transformers' interpolate_pos_encoding resizes it."""
    model = tiny_vit(tmp_path / "hf")
    pretrained, notes = convert(tmp_path / "hf")
    assert pretrained.stems == {"image": {"image_size": 32, "patch_size": 8, "channels": 3}}
    assert pretrained.codec.tokenizer is None and any("mean [0.5, 0.5, 0.5]" in note for note in notes)
    trunk = image_trunk(pretrained)
    for size in (32, 48):
        pixels = torch.randn(2, 3, size, size)
        with torch.no_grad():
            expected = model(pixels, interpolate_pos_encoding=size != 32).last_hidden_state
            assert (expected - trunk(pixels, stem="image")).abs().max() < 1e-5, size


@pytest.mark.parametrize("options", [{"layerscale_value": 0.5}, {"use_swiglu_ffn": True}, {"num_register_tokens": 4}],
                         ids=["mlp", "swiglu", "registers"])
def test_dinov2_outputs_equal_transformers_at_its_size_and_at_another(options, tmp_path):
    """DINOv2: ViT's layout with layer scale (per-channel vectors on each sublayer's output), the giant's SwiGLU
    feed-forward as the trunk's gated one, register tokens after [CLS] (``registers``: no positions); positions
    resized for a larger image as transformers resizes them."""
    torch.manual_seed(0)
    registers = "num_register_tokens" in options
    config = (transformers.Dinov2WithRegistersConfig if registers else transformers.Dinov2Config)(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, image_size=28, patch_size=7, **options)
    model = (transformers.Dinov2WithRegistersModel if registers else transformers.Dinov2Model)(config).eval()
    off_init(model)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 3:  # [CLS], the registers and the position table start at zero
                p.add_(torch.randn_like(p))
    model.save_pretrained(tmp_path / "hf")
    pretrained, _ = convert(tmp_path / "hf")
    assert pretrained.config.layer_scale == options.get("layerscale_value", 1.0)
    assert pretrained.config.registers == options.get("num_register_tokens", 0)
    trunk = image_trunk(pretrained)
    for size in (28, 42):
        pixels = torch.randn(2, 3, size, size)
        with torch.no_grad():
            expected = model(pixel_values=pixels).last_hidden_state
            assert (trunk(pixels, stem="image") - expected).abs().max() < 1e-5


@pytest.mark.parametrize("shape", [
    dict(hidden_size=384, num_hidden_layers=12, num_attention_heads=6),  # dinov2-small
    dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12),  # dinov2-base
    dict(hidden_size=1536, num_hidden_layers=40, num_attention_heads=24, use_swiglu_ffn=True),  # dinov2-giant
    dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, num_register_tokens=4),  # with registers
], ids=["small", "base", "giant", "with-registers-base"])
def test_dinov2_real_sizes_map_on_the_meta_device(shape):
    registers = "num_register_tokens" in shape
    with torch.device("meta"):
        model = (transformers.Dinov2WithRegistersModel if registers else transformers.Dinov2Model)(
            (transformers.Dinov2WithRegistersConfig if registers else transformers.Dinov2Config)(
                image_size=518, patch_size=14, **shape))
    mapped = map_weights(model.config.to_dict(), saved(model), "dinov2")
    # the mask token stays behind; [CLS]'s position row is folded into [CLS]
    assert sum(v.numel() for v in mapped.trunk.values()) == sum(p.numel() for p in model.parameters()) - 2 * shape[
        "hidden_size"]


@pytest.mark.parametrize("whole", [False, True], ids=["vision-tower", "clip-model"])
def test_clip_vision_outputs_equal_transformers_at_its_size_and_at_another(whole, tmp_path):
    """CLIP's vision tower, saved alone or inside a whole CLIP model (whose text tower is not read): its [CLS] vector
    and position row folded into the stem's [CLS], the norm before the blocks as the stem's, QuickGELU; every token
    after ``post_layernorm`` equals transformers' (its pooled output at [CLS]), at its size and resized."""
    torch.manual_seed(0)
    vision = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=28,
                  patch_size=7)
    if whole:
        text = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64, vocab_size=50)
        model = transformers.CLIPModel(transformers.CLIPConfig(vision_config=vision, text_config=text,
                                                               projection_dim=16)).eval()
    else:
        model = transformers.CLIPVisionModel(transformers.CLIPVisionConfig(**vision)).eval()
    tower = getattr(model, "vision_model", model)
    off_init(model)
    model.save_pretrained(tmp_path / "hf")
    pretrained, _ = convert(tmp_path / "hf")
    assert pretrained.config.activation == "quick_gelu" and pretrained.stems["image"]["patch_size"] == 7
    trunk = image_trunk(pretrained)
    for size in (28, 42):
        pixels = torch.randn(2, 3, size, size)
        with torch.no_grad():
            out = tower(pixel_values=pixels, interpolate_pos_encoding=size != 28)
            ours = trunk(pixels, stem="image")
            assert (ours - tower.post_layernorm(out.last_hidden_state)).abs().max() < 1e-5
            assert (ours[:, 0] - out.pooler_output).abs().max() < 1e-5


@pytest.mark.parametrize("whole", [False, True], ids=["vision-tower", "siglip-model"])
def test_siglip_vision_outputs_and_attention_pooling_equal_transformers(whole, tmp_path):
    """SigLIP's vision tower, alone or inside a whole SigLIP model (its text tower not read): no [CLS], positions on
    the patches only, tanh GELU, ``post_layernorm`` as the final norm; every token equals transformers' at its size and
    resized, and its attention-pooling head, read as Trunk's ``AttentionPool``, gives its pooled output."""
    from trunk.models import AttentionPool

    torch.manual_seed(0)
    vision = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=28,
                  patch_size=7)
    if whole:
        text = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64, vocab_size=50)
        model = transformers.SiglipModel(transformers.SiglipConfig(vision_config=vision, text_config=text)).eval()
    else:
        model = transformers.SiglipVisionModel(transformers.SiglipVisionConfig(**vision)).eval()
    tower = getattr(model, "vision_model", model)
    off_init(model)
    model.save_pretrained(tmp_path / "hf")
    pretrained, notes = convert(tmp_path / "hf")
    assert not pretrained.config.cls_token and pretrained.config.activation == "gelu_tanh"
    assert any("attention-pooling head" in note for note in notes)
    trunk = image_trunk(pretrained)
    pool = AttentionPool(pretrained.config).eval()
    pool.load_state_dict({k.removeprefix("attention_pool."): v for k, v in pretrained.pooler.items()})
    for size in (28, 42):
        pixels = torch.randn(2, 3, size, size)
        with torch.no_grad():
            out = tower(pixel_values=pixels, interpolate_pos_encoding=size != 28)
            ours = trunk(pixels, stem="image")
            assert ours.shape[1] == (size // 7) ** 2  # patches only
            assert (ours - out.last_hidden_state).abs().max() < 1e-5
            assert (pool(ours) - out.pooler_output).abs().max() < 1e-5


def test_siglip_base_maps_on_the_meta_device():
    """google/siglip-base-patch16-224's vision tower: every weight maps (the text tower and the similarity's scale and
    bias stay)."""
    config = transformers.SiglipConfig(vision_config=dict(patch_size=16, image_size=224))
    with torch.device("meta"):
        model = transformers.SiglipModel(config)
    mapped = map_weights(config.to_dict(), saved(model), "siglip")
    assert mapped.config.n_layers == 12 and mapped.config.max_len == 196
    assert mapped.pooler["attention_pool.attn.kv_proj.weight"].shape == (2 * 768, 768)


def timm_names(theirs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A transformers ViT's weights (as saved) under timm's names: what a timm ViT of the same math holds."""
    names = {"embeddings.patch_embeddings.projection": "patch_embed.proj", "layernorm": "norm"}
    ours = {"cls_token": theirs["embeddings.cls_token"], "pos_embed": theirs["embeddings.position_embeddings"]}
    for name, tensor in theirs.items():
        module, leaf = name.rsplit(".", 1)
        if module in names:
            ours[f"{names[module]}.{leaf}"] = tensor
        elif match := re.fullmatch(r"encoder\.layer\.(\d+)\.(.*)", module):
            i, part = match.groups()
            if part == "attention.attention.query":
                parts = [f"encoder.layer.{i}.attention.attention.{kind}.{leaf}" for kind in ("query", "key", "value")]
                ours[f"blocks.{i}.attn.qkv.{leaf}"] = torch.cat([theirs[part] for part in parts])
            renamed = {"attention.output.dense": "attn.proj", "layernorm_before": "norm1", "layernorm_after": "norm2",
                       "intermediate.dense": "mlp.fc1", "output.dense": "mlp.fc2"}.get(part)
            if renamed:
                ours[f"blocks.{i}.{renamed}.{leaf}"] = tensor
    return ours


def timm_folder(folder: Path, **model_args):
    """A timm ViT's Hub folder (config.json with its architecture and pretrained_cfg, model.safetensors in timm's
    names) holding the weights of a random transformers ViT of the same math (eps 1e-6, as timm's), and that ViT."""
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = transformers.ViTModel(transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, image_size=28, patch_size=7,
        layer_norm_eps=1e-6), add_pooling_layer=False).eval()
    off_init(model)
    with torch.no_grad():
        model.embeddings.cls_token.normal_()
        model.embeddings.position_embeddings.normal_()
    ours = {**timm_names(saved(model)), "head.weight": torch.randn(10, 32), "head.bias": torch.randn(10)}
    folder.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in ours.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({
        "architecture": "vit_tiny_patch7_28.test", "num_classes": 10, "global_pool": "token",
        "model_args": {"embed_dim": 32, "depth": 2, "num_heads": 4, **model_args},
        "pretrained_cfg": {"input_size": [3, 28, 28], "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5],
                           "classifier": "head"}}))
    return model


def test_a_timm_vit_outputs_equal_the_same_vit_in_transformers(tmp_path):
    """timm's ViT state dict (a Hub timm folder: config.json with its architecture and pretrained_cfg): the fused
    query-key-value projection split, [CLS]'s position folded in, its classifier left behind, its normalisation said
    in the notes; every token equals transformers' ViT with the same weights, at its size and resized."""
    model = timm_folder(tmp_path / "timm")
    pretrained, notes = convert(tmp_path / "timm")
    assert pretrained.stems["image"] == {"image_size": 28, "patch_size": 7, "channels": 3}
    assert any("mean [0.5, 0.5, 0.5]" in note for note in notes)
    trunk = image_trunk(pretrained)
    for size in (28, 42):
        pixels = torch.randn(2, 3, size, size)
        with torch.no_grad():
            expected = model(pixel_values=pixels, interpolate_pos_encoding=size != 28).last_hidden_state
            assert (trunk(pixels, stem="image") - expected).abs().max() < 1e-5


def test_timm_vit_base_patch16_224_maps_on_the_meta_device():
    """vit_base_patch16_224's shape by its name alone: every weight of timm's state dict maps (its classifier stays)."""
    with torch.device("meta"):
        model = transformers.ViTModel(transformers.ViTConfig(), add_pooling_layer=False)
    tensors = {**timm_names(saved(model)), "head.weight": torch.empty(1000, 768, device="meta")}
    mapped = map_weights({"model_type": "timm", "architecture": "vit_base_patch16_224.augreg2_in21k_ft_in1k",
                          "pretrained_cfg": {"input_size": [3, 224, 224]}}, tensors, "timm")
    assert (mapped.config.d_model, mapped.config.n_layers, mapped.config.n_heads) == (768, 12, 12)
    assert mapped.stems["image"]["patch_size"] == 16 and mapped.config.max_len == 197


@pytest.mark.parametrize("option,value", [("global_pool", "avg"), ("reg_tokens", 4), ("qk_norm", True)])
def test_a_timm_option_the_trunk_cannot_compute_is_refused_by_name(option, value, tmp_path):
    timm_folder(tmp_path / "timm", **{option: value})
    with pytest.raises(ValueError, match=f"has {option}={value!r}, which the trunk cannot compute"):
        convert(tmp_path / "timm")


def test_clip_vit_b16_maps_on_the_meta_device():
    """openai/clip-vit-base-patch16's vision tower: every weight of it maps (the text tower and projections stay)."""
    config = transformers.CLIPConfig(vision_config=dict(patch_size=16))
    with torch.device("meta"):
        model = transformers.CLIPModel(config)
    mapped = map_weights(config.to_dict(), saved(model), "clip")
    tower = sum(p.numel() for p in model.vision_model.parameters())
    # one row fewer (the [CLS] position row, folded into [CLS]), one zero bias more (the patch projection's): as many
    assert sum(v.numel() for v in mapped.trunk.values()) == tower
    assert mapped.stems == {"image": {"image_size": 224, "patch_size": 16, "channels": 3}}


@pytest.mark.parametrize("source, task", [("clip", "text"), ("bert", "image")])
def test_a_model_of_another_kind_than_the_tasks_is_named(source, task, sentiment_files, tmp_path):
    """A vision tower for text tasks, a text encoder for image tasks: one line naming what the folder reads and what
    the tasks need, before any weight is loaded into the run (a trunk of Trunk's own lends its blocks instead)."""
    if source == "clip":
        transformers.CLIPVisionModel(transformers.CLIPVisionConfig(
            hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64, image_size=28,
            patch_size=7)).save_pretrained(tmp_path / "hf")
    else:
        tiny("bert", tmp_path / "hf", masked_lm=False)
    if task == "text":
        args = ["--model=trunk.tasks.SequenceClassification", "--data=trunk.datamodules.TextClassificationData",
                f"--data.train={sentiment_files['train']}"]
    else:
        args = ["--model=trunk.tasks.ImageClassification", "--data=trunk.datamodules.ImageClassificationData",
                "--data.dataset=trunk:shapes", "--data.train=train"]
    reads = {"text": "text", "image": "images"}
    model_type, its_inputs = ("clip_vision_model", "images") if source == "clip" else ("bert", "text")
    with pytest.raises(ValueError, match=rf"is a {model_type} model that reads {its_inputs}, and this run's tasks "
                                         rf"read {reads[task]}"):
        run_cli(single_task([*args, f"--model.init_from={tmp_path / 'hf'}",
                             f"--trainer.default_root_dir={tmp_path / 'run'}"], "t"), run=False)


def test_a_vit_fine_tunes_at_another_image_size_with_its_positions_resized(tmp_path):
    from trunk.assembly.weights import from_pretrained
    from trunk.tasks import ImageClassification

    model = tiny_vit(tmp_path / "hf")
    task = ImageClassification(image_size=48, patch_size=8, channels=3)
    built = from_pretrained(tmp_path / "hf", {"shapes": task}, task_info={"shapes": {"label_names": ["a", "b"],
                                                                                    "stem": "image"}})
    built.eval()
    pixels = torch.randn(2, 3, 48, 48)
    with torch.no_grad():
        expected = model(pixels, interpolate_pos_encoding=True).last_hidden_state
        assert (expected - built.trunk(pixels, stem="image")).abs().max() < 1e-5
    assert built.trunk.stems["image"].position.shape == (1, 36, 32)  # the 6x6 grid's own table


def tiny_bart(folder: Path):
    folder.mkdir(parents=True, exist_ok=True)
    vocab = write_bpe(folder)
    torch.manual_seed(0)
    config = transformers.BartConfig(
        vocab_size=len(vocab), d_model=32, encoder_layers=2, decoder_layers=3, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64, dropout=0.0,
        attention_dropout=0.0, activation_dropout=0.0, pad_token_id=1, bos_token_id=0, eos_token_id=2,
        decoder_start_token_id=2, forced_bos_token_id=None, forced_eos_token_id=None,
    )
    model = transformers.BartForConditionalGeneration(config).eval()
    off_init(model)
    with torch.no_grad():
        model.final_logits_bias.add_(torch.randn_like(model.final_logits_bias))
    model.save_pretrained(folder)
    return model


def test_a_base_bart_saved_without_its_lm_head_reads_with_a_zero_output_bias_and_says_so(tmp_path):
    """BartModel (no final_logits_bias), its token table kept under the encoder's name instead of ``shared``: read,
    the decoder's output bias zero as transformers starts it, with a warning; the encoder's outputs equal."""
    model = tiny_bart(tmp_path / "hf")
    tensors = safetensors.torch.load_file(tmp_path / "hf" / "model.safetensors")
    base = {k.removeprefix("model."): v for k, v in tensors.items() if k.startswith("model.")}
    base["encoder.embed_tokens.weight"] = base.pop("shared.weight")
    safetensors.torch.save_file(base, tmp_path / "hf" / "model.safetensors", metadata={"format": "pt"})
    with pytest.warns(UserWarning, match="no final_logits_bias .* output bias starts at zero"):
        pretrained, _ = convert(tmp_path / "hf")
    assert not pretrained.heads["translation"]["state"]["decoder.output_bias"].any()
    trunk = trunk_of(pretrained)
    ids, mask, _ = batch(pretrained.codec.tokenizer, SENTENCES)
    with torch.no_grad():
        expected = model.model.encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        assert (expected - trunk(ids, mask))[mask.bool()].abs().max() < 1e-5


def test_bart_teacher_forced_logits_and_greedy_output_equal_transformers(tmp_path):
    """BART: the encoder as the trunk, the decoder as the translation head's; under teacher forcing the logits equal
    transformers' within 1e-5, and greedy generation writes the same tokens."""
    from trunk.core.contract import TaskSpec
    from trunk.tasks import Translation

    model = tiny_bart(tmp_path / "hf")
    pretrained, notes = convert(tmp_path / "hf")
    assert any("decoder" in note and "'translation'" in note for note in notes)
    trunk = trunk_of(pretrained)
    objective = Translation(decoder_layers=3)
    objective.build("translation", trunk, TaskSpec(target_vocab_size=pretrained.config.vocab_size))
    objective.load_head(pretrained.heads["translation"]["state"], None, False, "test")
    objective.connect(pretrained.codec)
    objective.eval()
    tokenizer = pretrained.codec.tokenizer
    ids, mask, _ = batch(tokenizer, SENTENCES)
    targets, _, _ = batch(tokenizer, ["a good film", "the plot is dull and the music is not", "great"])
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask, decoder_input_ids=targets).logits
        ours = objective(trunk, {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": targets})
        real = targets != special_id(tokenizer, PAD)
        assert (expected - ours)[real].abs().max() < 1e-5
        ids_ = objective.generation_ids
        generated = objective.generate(trunk, ids, mask, beam_size=1)
        steps = generated.shape[1]
        reference = model.generate(
            input_ids=ids, attention_mask=mask, decoder_start_token_id=ids_.bos, eos_token_id=ids_.eos,
            pad_token_id=ids_.pad, bad_words_ids=[[t] for t in ids_.banned], num_beams=1, do_sample=False,
            max_new_tokens=steps, min_length=0, no_repeat_ngram_size=0,
        )[:, 1:]
    for ours_row, theirs_row in zip(generated.tolist(), reference.tolist()):
        cut = lambda row: row[: row.index(ids_.eos) + 1] if ids_.eos in row else row  # noqa: E731
        assert cut(ours_row) == cut(theirs_row)


def test_a_translation_task_fine_tunes_from_the_pretrained_bart_decoder(request, tmp_path):
    from kinds import DATA_FILES, KINDS
    from test_matrix import kind_args

    tiny_bart(tmp_path / "hf")
    files = {source: request.getfixturevalue(f"{source}_files") for source in set(DATA_FILES.values()) - {None}}
    args = [a for a in kind_args(KINDS["translation"], files, tmp_path / "run")
            if not a.startswith(("--model.trunk.", "--data.tok"))]
    with pytest.raises(ValueError, match=r"The stored head was built with \{'decoder_layers': 3\}"):
        run_cli([*args, f"--model.init_from={tmp_path / 'hf'}", "--model.heads_from={t: translation}"], run=False)
    cli = run_cli([*args, f"--model.init_from={tmp_path / 'hf'}", "--model.heads_from={t: translation}",
                   "--model.tasks.t.init_args.decoder_layers=3"], run=False)
    decoder = cli.model.objectives["t"].decoder
    state = convert(tmp_path / "hf")[0].heads["translation"]["state"]
    assert torch.equal(decoder.blocks[2].cross_attn.kv_proj.weight, state["decoder.blocks.2.cross_attn.kv_proj.weight"])
    assert decoder.stem.token.weight is cli.model.trunk.stems["text"].token.weight  # one matrix, three uses
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert torch.isfinite(cli.trainer.callback_metrics["train/loss"])


def test_a_hub_model_downloads_its_weights_and_tokenizer_pickles_only_where_it_has_no_safetensors(
        monkeypatch, sentiment_files, tmp_path):
    """hf://ORG/NAME of a transformers model: the download asks for its config, safetensors and tokenizer files, and
    asks again with pytorch_model.bin only when no safetensors came; then the folder is read as any."""
    import fnmatch

    import huggingface_hub

    model = tiny("bert", tmp_path / "hub", masked_lm=False)
    torch.save(model.state_dict(), tmp_path / "hub" / "pytorch_model.bin")
    (tmp_path / "hub" / "model.safetensors").rename(tmp_path / "model.safetensors.away")
    asked = []

    def snapshot(repo, revision=None, allow_patterns=None):  # the files of the "repository" the patterns match
        asked.append(allow_patterns)
        local = tmp_path / f"cache{len(asked)}"
        local.mkdir()
        for path in (tmp_path / "hub").iterdir():
            if any(fnmatch.fnmatch(path.name, pattern) for pattern in allow_patterns):
                (local / path.name).write_bytes(path.read_bytes())
        return str(local)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot)
    cli = run_cli(finetune_args("hf://google/tiny-bert", sentiment_files, tmp_path / "run"), run=False)
    assert len(asked) == 2 and "pytorch_model.bin" not in asked[0] and "pytorch_model.bin" in asked[1]
    assert "vocab.txt" in asked[0] and "*.safetensors" in asked[0]
    assert torch.equal(cli.model.trunk.stems["text"].token.weight, model.embeddings.word_embeddings.weight)


def sentence_transformers_layout(folder: Path, inside: str) -> None:
    """Rearrange a transformers folder as a sentence-transformers model: modules.json, a pooling module, and the
    transformer's files in ``inside`` (older models: 0_Transformer; newer: "", the folder itself)."""
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32,
                                                                  "pooling_mode_mean_tokens": True}))
    if inside:
        (folder / inside).mkdir()
        for path in folder.iterdir():
            if path.is_file():
                path.rename(folder / inside / path.name)
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": inside, "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))


@pytest.mark.parametrize("inside", ["0_Transformer", ""])
def test_a_sentence_transformers_model_is_read_from_its_transformers_folder(inside, sentiment_files, tmp_path,
                                                                            monkeypatch):
    """Older sentence-transformers models keep the transformer in 0_Transformer/ (modules.json says where), newer ones
    beside modules.json: a folder of either, and a Hub model of either (its transformer's files downloaded), starts a
    run with the same weights."""
    import fnmatch

    import huggingface_hub

    model = tiny("bert", tmp_path / "st", masked_lm=False)
    sentence_transformers_layout(tmp_path / "st", inside)
    cli = run_cli(finetune_args(tmp_path / "st", sentiment_files, tmp_path / "run"), run=False)
    assert torch.equal(cli.model.trunk.stems["text"].token.weight, model.embeddings.word_embeddings.weight)

    def snapshot(repo, revision=None, allow_patterns=None):  # the repository's files the patterns match, as the Hub's
        local = tmp_path / f"cache{len(list(tmp_path.glob('cache*')))}"
        for path in (tmp_path / "st").rglob("*"):
            name = path.relative_to(tmp_path / "st").as_posix()
            if path.is_file() and any(fnmatch.fnmatch(name, pattern) for pattern in allow_patterns):
                (local / name).parent.mkdir(parents=True, exist_ok=True)
                (local / name).write_bytes(path.read_bytes())
        return str(local)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot)
    cli = run_cli(finetune_args("hf://sentence-transformers/tiny", sentiment_files, tmp_path / "hub_run"), run=False)
    assert torch.equal(cli.model.trunk.stems["text"].token.weight, model.embeddings.word_embeddings.weight)


def test_a_model_folder_without_its_tokenizer_takes_one_from_another_folder(tmp_path):
    tiny("bert", tmp_path / "hf")
    (tmp_path / "tok").mkdir()
    (tmp_path / "hf" / "vocab.txt").rename(tmp_path / "tok" / "vocab.txt")
    with pytest.raises(SystemExit, match=r"has no tokenizer .* Give the model's tokenizer folder with --tokenizer DIR"):
        import_main([str(tmp_path / "hf"), str(tmp_path / "trunk")])
    assert not (tmp_path / "trunk").exists()
    import_main([str(tmp_path / "hf"), str(tmp_path / "trunk"), "--tokenizer", str(tmp_path / "tok")])
    assert load_pretrained(tmp_path / "trunk").codec.tokenizer.token_to_id("[SEP]") == 8


def write_t5_tokenizer(folder: Path) -> int:
    """A tokenizer with T5's special tokens only (<pad> 0, </s> 1, <unk> 2; no [CLS], no mask) that ends each input
    with </s>, as T5's does."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator([" ".join(WORDS)] * 4 + SENTENCES, trainers.BpeTrainer(
        vocab_size=120, special_tokens=["<pad>", "</s>", "<unk>"], show_progress=False))
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A </s> $B </s>",
                                                             special_tokens=[("</s>", 1)])
    tokenizer.save(str(folder / "tokenizer.json"))
    return tokenizer.get_vocab_size()


def tiny_t5(folder: Path, model_type: str = "t5", **options):
    folder.mkdir(parents=True, exist_ok=True)
    vocab = write_t5_tokenizer(folder)
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(model_type, vocab_size=vocab, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                               num_decoder_layers=2, num_heads=4, dropout_rate=0.0, pad_token_id=0,
                                               eos_token_id=1, decoder_start_token_id=0, **options)
    model = transformers.AutoModelForSeq2SeqLM.from_config(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 or "relative_attention_bias" in name:
                p.add_(torch.randn_like(p) * 0.3)
    model.save_pretrained(folder)
    return model


@pytest.mark.parametrize("model_type,feed_forward", [("t5", "relu"), ("t5", "gated-gelu"), ("mt5", "gated-gelu")])
def test_t5_encoder_logits_and_greedy_output_equal_transformers(model_type, feed_forward, tmp_path):
    """T5: RMSNorm, relative position biases in encoder and decoder, no biases, unscaled attention, a plain or gated
    feed-forward, and a tokenizer with neither [CLS] nor a mask (the decoder starts from <pad>, as T5's does); mT5 is
    T5 v1.1 (gated) under its own name."""
    from trunk.core.contract import TaskSpec
    from trunk.tasks import Translation

    model = tiny_t5(tmp_path / "hf", model_type, feed_forward_proj=feed_forward)
    pretrained, notes = convert(tmp_path / "hf")
    assert pretrained.config.rms_norm and pretrained.config.gated_ff == (feed_forward != "relu")
    trunk = trunk_of(pretrained)
    tokenizer = pretrained.codec.tokenizer
    ids, mask, _ = batch(tokenizer, SENTENCES)
    targets, _, _ = batch(tokenizer, ["a good film", "the plot is dull and the music is not", "great"])
    with torch.no_grad():
        encoded = model.encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        assert (encoded - trunk(ids, mask))[mask.bool()].abs().max() < 1e-5
    objective = Translation(decoder_layers=2)
    objective.build("translation", trunk, TaskSpec(target_vocab_size=pretrained.config.vocab_size))
    objective.load_head(pretrained.heads["translation"]["state"], None, False, "test")
    objective.connect(pretrained.codec)
    objective.eval()
    start = torch.zeros(len(targets), 1, dtype=torch.long)  # T5 starts from <pad>
    decoder_inputs = torch.cat([start, targets[:, :-1]], 1)
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_inputs).logits
        ours = objective(trunk, {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": decoder_inputs})
        assert (expected - ours).abs().max() < 1e-4
        special = objective.generation_ids
        assert (special.bos, special.eos, special.pad) == (0, 1, 0)
        generated = objective.generate(trunk, ids, mask, beam_size=1)
        reference = model.generate(input_ids=ids, attention_mask=mask, decoder_start_token_id=0, eos_token_id=1,
                                   pad_token_id=0, bad_words_ids=[[t] for t in special.banned], num_beams=1,
                                   do_sample=False, max_new_tokens=generated.shape[1], min_length=0)[:, 1:]
    for ours_row, theirs_row in zip(generated.tolist(), reference.tolist()):
        cut = lambda row: row[: row.index(1) + 1] if 1 in row else row  # noqa: E731
        assert cut(ours_row) == cut(theirs_row)


@pytest.mark.parametrize("model_type", ["t5", "mt5"])
def test_t5_with_an_output_projection_of_its_own(model_type, tmp_path):
    """T5 v1.1, flan-t5 and mT5 files: lm_head.weight of its own, tie_word_embeddings false, no output scaling. The
    decoder then reads its logits through that projection."""
    from safetensors.torch import load_file, save_file

    from trunk.core.contract import TaskSpec
    from trunk.tasks import Translation

    model = tiny_t5(tmp_path / "hf", model_type, feed_forward_proj="gated-gelu")
    tensors = load_file(str(tmp_path / "hf" / "model.safetensors"))
    lm_head = torch.randn(model.config.vocab_size, 32)
    save_file({**tensors, "lm_head.weight": lm_head}, str(tmp_path / "hf" / "model.safetensors"))
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config.update(tie_word_embeddings=False)
    config.pop("scale_decoder_outputs", None)
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    pretrained, _ = convert(tmp_path / "hf")
    assert pretrained.heads["translation"]["meta"]["objective"]["init_args"]["tied_output"] is False
    trunk = trunk_of(pretrained)
    objective = Translation(decoder_layers=2, tied_output=False)
    objective.build("translation", trunk, TaskSpec(target_vocab_size=pretrained.config.vocab_size))
    objective.load_head(pretrained.heads["translation"]["state"], None, False, "test")
    objective.eval()
    ids, mask, _ = batch(pretrained.codec.tokenizer, SENTENCES)
    decoder_inputs = torch.zeros(len(SENTENCES), 4, dtype=torch.long)
    decoder_inputs[:, 1:] = ids[:, :3]
    with torch.no_grad():
        encoded = model.encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        hidden = model.decoder(input_ids=decoder_inputs, encoder_hidden_states=encoded,
                               encoder_attention_mask=mask).last_hidden_state
        ours = objective(trunk, {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": decoder_inputs})
    assert (hidden @ lm_head.T - ours).abs().max() < 1e-4


def test_a_tokenizer_without_cls_or_mask_fine_tunes_and_refuses_masking_by_name(sentiment_files, tmp_path):
    """T5's tokenizer has no [CLS] and no mask: a classifier trains on its encoder (mean pooling); masked-LM, which
    needs a mask token, is one clear error."""
    tiny_t5(tmp_path / "hf", feed_forward_proj="relu")
    cli = run_cli(["fit", *finetune_args(tmp_path / "hf", sentiment_files, tmp_path / "run"),
                   "--model.tasks.sentiment.init_args.pooling=mean"])
    assert torch.isfinite(cli.trainer.callback_metrics["train/loss"])
    batch = next(iter(cli.datamodule.train_dataloader()))
    assert (batch["input_ids"] == 1).sum(1).eq(1).all()  # each text ends with its </s>, none starts with a [CLS]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(SENTENCES * 20) + "\n")
    args = single_task(["fit", "--model=trunk.tasks.MaskedLanguageModeling", f"--model.init_from={tmp_path / 'hf'}",
                        "--data=trunk.datamodules.CorpusData", f"--data.train={corpus}", "--data.max_length=16",
                        "--trainer.max_steps=1", f"--trainer.default_root_dir={tmp_path / 'mlm'}"], "mlm")
    with pytest.raises(ValueError, match=r"needs a \[MASK\] token \(<mask> in RoBERTa's spelling\), and this "
                                         r"tokenizer has neither"):
        run_cli(args)


def test_an_output_folder_that_cannot_be_created_is_refused_before_any_work(tmp_path):
    """Under /proc, or under a file: one line naming the folder, said before the model is read (it named a temporary
    folder of its own before)."""
    tiny("bert", tmp_path / "hf")
    (tmp_path / "file").write_text("not a folder")
    targets = [tmp_path / "file" / "out", *([Path("/proc/trunk-test/out")] if Path("/proc").is_dir() else [])]
    for target in targets:
        with pytest.raises(SystemExit) as exit_info:
            import_main([str(tmp_path / "hf"), str(target)])
        said = str(exit_info.value.code)
        assert said.startswith(f"error: DIR='{target}': no folder can be created in") and "\n" not in said, said
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "hf"]
