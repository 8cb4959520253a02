"""The from-scratch trunk against independent references, and its invariances."""

import math

import pytest
import torch
from torch import nn

from trunk.models import (
    Attention,
    AttentionPool,
    Backbone,
    SequenceClassificationHead,
    TokenStem,
    Trunk,
    TrunkConfig,
    build_trunk,
    init_weights,
    pool,
    sinusoidal_positions,
)


def naive_attention(attn: Attention, x, key_padding_mask=None, context=None, causal=False, bias=None):
    """Attention written out by hand: softmax(QK^T / sqrt(d) + bias + mask) V, on the module's weights."""
    B, T, C = x.shape
    src = x if context is None else context
    H, D = attn.n_heads, C // attn.n_heads
    q = (x @ attn.q_proj.weight.T + attn.q_proj.bias).view(B, T, H, D).transpose(1, 2)
    kv = src @ attn.kv_proj.weight.T + attn.kv_proj.bias
    k, v = kv[..., :C], kv[..., C:]
    k = k.reshape(B, -1, H, D).transpose(1, 2)
    v = v.reshape(B, -1, H, D).transpose(1, 2)
    scores = q @ k.transpose(-1, -2) / math.sqrt(D)
    if bias is not None:
        scores = scores + bias
    if key_padding_mask is not None:
        scores = scores.masked_fill(~key_padding_mask[:, None, None, :], float("-inf"))
    if causal:
        S = k.shape[2]
        scores = scores.masked_fill(torch.ones(T, S, dtype=torch.bool).tril(S - T).logical_not(), float("-inf"))
    y = scores.softmax(-1) @ v
    return y.transpose(1, 2).reshape(B, T, C) @ attn.out_proj.weight.T + attn.out_proj.bias


@pytest.fixture
def attn():
    torch.manual_seed(0)
    module = Attention(d_model=32, n_heads=4).eval()
    init_weights(module, std=0.2)
    for p in module.parameters():  # non-zero biases so that bias handling is tested too
        if p.ndim == 1:
            nn.init.normal_(p, std=0.1)
    return module


def test_attention_matches_naive_reference(attn):
    x = torch.randn(3, 7, 32)
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[1, 4:] = False
    mask[2, 1:] = False
    torch.testing.assert_close(attn(x, mask), naive_attention(attn, x, mask), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(attn(x, causal=True), naive_attention(attn, x, causal=True), atol=1e-5, rtol=1e-5)
    ctx = torch.randn(3, 5, 32)
    torch.testing.assert_close(attn(x, context=ctx), naive_attention(attn, x, context=ctx), atol=1e-5, rtol=1e-5)


def test_attention_matches_torch_multihead_attention(attn):
    """Same weights loaded into torch.nn.MultiheadAttention give the same outputs."""
    mha = nn.MultiheadAttention(32, 4, batch_first=True).eval()
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.cat([attn.q_proj.weight, attn.kv_proj.weight]))
        mha.in_proj_bias.copy_(torch.cat([attn.q_proj.bias, attn.kv_proj.bias]))
        mha.out_proj.weight.copy_(attn.out_proj.weight)
        mha.out_proj.bias.copy_(attn.out_proj.bias)
    x = torch.randn(2, 6, 32)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]], dtype=torch.bool)
    expected, _ = mha(x, x, x, key_padding_mask=~mask, need_weights=False)
    torch.testing.assert_close(attn(x, mask), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("positions", ["learned", "sinusoidal", "rope", "alibi", "t5", "disentangled"])
def test_padding_does_not_change_real_token_outputs(norm, positions):
    torch.manual_seed(0)
    cfg = TrunkConfig(
        vocab_size=50, d_model=32, n_layers=3, n_heads=4, d_ff=64, max_len=32, norm=norm, positions=positions
    )
    trunk = Trunk(Backbone(cfg), {"text": TokenStem(cfg)}).eval()
    init_weights(trunk)
    ids = torch.randint(5, 50, (2, 9))
    short = trunk(ids, torch.ones_like(ids))
    padded_ids = torch.cat([ids, torch.zeros(2, 7, dtype=torch.long)], dim=1)
    mask = torch.cat([torch.ones_like(ids), torch.zeros(2, 7, dtype=torch.long)], dim=1)
    padded = trunk(padded_ids, mask)
    torch.testing.assert_close(padded[:, :9], short, atol=1e-5, rtol=1e-5)
    # DeBERTa's enhanced mask decoder (the last block twice, its queries from absolute positions) on any trunk
    table = torch.randn(16, 32)
    decoded = trunk(ids, torch.ones_like(ids), decoder_positions=table[:9])
    assert not torch.allclose(decoded, short, atol=1e-2)
    torch.testing.assert_close(trunk(padded_ids, mask, decoder_positions=table)[:, :9], decoded, atol=1e-5, rtol=1e-5)

    for pooling in ("mean", "max", "attention"):
        pool = AttentionPool(cfg) if pooling == "attention" else None
        head = SequenceClassificationHead(32, 3, pooling=pooling, attention_pool=pool).eval()
        torch.testing.assert_close(head(padded, mask), head(short, torch.ones_like(ids)), atol=1e-5, rtol=1e-5)


def test_sinusoidal_positions_follow_the_formula():
    table = sinusoidal_positions(10, 8)
    pos, i = 7, 1
    assert table[pos, 2 * i].item() == pytest.approx(math.sin(pos / 10000 ** (2 * i / 8)), abs=1e-6)
    assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(pos / 10000 ** (2 * i / 8)), abs=1e-6)


def test_rotary_scores_depend_only_on_the_distance_between_positions():
    from trunk.models.positions import rotate

    torch.manual_seed(0)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)
    def score(i, j):  # the query at position i, the key at position j
        return (rotate(q, offset=i) * rotate(k, offset=j)).sum().item()
    assert score(3, 1) == pytest.approx(score(10, 8), abs=1e-4) == pytest.approx(score(52, 50), abs=1e-4)
    assert score(3, 1) != pytest.approx(score(3, 2), abs=1e-3)
    assert torch.allclose(rotate(q).norm(), q.norm())  # a rotation: lengths are kept


def test_rope_trunks_have_no_absolute_positions_and_see_order():
    cfg = TrunkConfig(vocab_size=50, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_len=16, positions="rope")
    trunk = Trunk(Backbone(cfg), {"text": TokenStem(cfg)}).eval()
    assert not any("position" in name for name, _ in trunk.named_parameters())
    ids = torch.tensor([[5, 6, 7, 8]])
    assert not torch.allclose(trunk(ids)[0, 0], trunk(ids.flip(1))[0, -1])  # same token, other place: other vector


def t5_bucket(relative: int, bidirectional: bool, buckets: int = 32, max_distance: int = 128) -> int:
    """T5's relative-position bucket of one (key - query) distance, written out from the paper's description."""
    start = 0
    if bidirectional:
        buckets //= 2
        start = buckets if relative > 0 else 0
        distance = abs(relative)
    else:
        distance = max(-relative, 0)
    exact = buckets // 2
    if distance < exact:
        return start + distance
    return start + min(
        buckets - 1, exact + int(math.log(distance / exact) / math.log(max_distance / exact) * (buckets - exact))
    )


def test_alibi_slopes_and_t5_buckets_follow_their_papers():
    from trunk.models.positions import alibi_slopes, relative_buckets

    assert alibi_slopes(8).tolist() == [2.0 ** -k for k in range(1, 9)]
    assert alibi_slopes(6).tolist() == [
        2.0**-2,
        2.0**-4,
        2.0**-6,
        2.0**-8,
        2.0**-1,
        2.0**-3,
    ]  # 4 heads', then 8's odd ones
    relative = torch.arange(-300, 301)
    for bidirectional in (True, False):
        expected = [t5_bucket(r, bidirectional) for r in relative.tolist()]
        assert relative_buckets(relative, bidirectional, 32, 128).tolist() == expected
    assert (
        t5_bucket(-1, True) == 1
        and t5_bucket(1, True) == 17
        and t5_bucket(-500, True) == 15
        and t5_bucket(5, False) == 0
    )


@pytest.mark.parametrize("positions", ["alibi", "t5"])
def test_position_biased_attention_matches_the_written_out_bias(positions):
    """Every block's attention adds -slope * |i - j| (ALiBi) or the learned value of the distance's bucket (T5, one
    table for all blocks) to its scores; the stack equals blocks run on naive attention with that bias."""
    torch.manual_seed(0)
    cfg = TrunkConfig(
        vocab_size=50,
        d_model=32,
        n_layers=2,
        n_heads=4,
        d_ff=64,
        max_len=64,
        positions=positions,
        dropout=0.0,
        attn_dropout=0.0,
        relative_buckets=8,
        relative_max_distance=16,
    )
    trunk = Trunk(Backbone(cfg), {"text": TokenStem(cfg)}).eval()
    init_weights(trunk)
    if positions == "t5":
        nn.init.normal_(trunk.backbone.position_bias.embedding.weight, std=1.0)  # large enough to matter
        assert not any("position" in name for name, _ in trunk.stems.named_parameters())
    ids = torch.randint(5, 50, (2, 40))
    mask = torch.ones(2, 40, dtype=torch.bool)
    mask[1, 25:] = False
    T, H = 40, 4
    bias = torch.zeros(1, H, T, T)
    for h in range(H):
        for i in range(T):
            for j in range(T):
                if positions == "alibi":
                    bias[0, h, i, j] = -(2.0 ** (-8 * (h + 1) / H)) * abs(i - j)
                else:
                    bias[0, h, i, j] = trunk.backbone.position_bias.embedding.weight[t5_bucket(j - i, True, 8, 16), h]
    x = trunk.stems["text"](ids)
    for block in trunk.backbone.blocks:
        x = x + naive_attention(block.attn, block.norm_attn(x), mask, bias=bias)
        x = x + block.ff(block.norm_ff(x))
    expected = trunk.backbone.final_norm(x)
    with torch.no_grad():
        torch.testing.assert_close(trunk(ids, mask)[mask], expected[mask], atol=1e-4, rtol=1e-4)
    # the bias is the only position information: reversed inputs give mirrored outputs under ALiBi's symmetric bias
    if positions == "alibi":
        whole = torch.ones(1, 40, dtype=torch.bool)
        torch.testing.assert_close(trunk(ids[:1].flip(1), whole).flip(1), trunk(ids[:1], whole), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("positions", [None, "alibi", "t5"])
def test_sliding_window_attention_is_attention_under_its_window_and_global_mask(positions, causal):
    """Chunked local attention equals attention under the written-out (T, T) mask: keys at most ``radius`` away, the
    first ``n_global`` positions seeing and seen by all, padding masked; with a position bias, and causal; including a
    length that is no multiple of the chunk and padding queries whose window holds no real key (finite, no NaN)."""
    from trunk.models.local_attention import sliding_window, sliding_window_attention
    from trunk.models.positions import PositionBias

    torch.manual_seed(0)
    B, H, T, D = 3, 4, 23, 8
    q, k, v = (torch.randn(B, H, T, D, dtype=torch.float64, requires_grad=True) for _ in range(3))
    real = torch.ones(B, T, dtype=torch.bool)
    real[1, 15:] = False
    real[2, 3:] = False  # example 2: its padding queries far on have no real key in reach without globals
    bias = (
        None
        if positions is None
        else PositionBias(positions, H, causal=causal, num_buckets=8, max_distance=16).double()
    )
    if positions == "t5":
        nn.init.normal_(bias.embedding.weight, std=1.0)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    for radius, n_global in [(3, 0), (3, 2), (5, 1), (4, 30)]:
        n_global = min(n_global, T)
        allowed = ((i - j).abs() <= radius) | (i < n_global) | (j < n_global)
        if causal:
            allowed = allowed & (j <= i)
        allowed = allowed[None, None] & real[:, None, None, :]
        scores = q @ k.transpose(-1, -2) / math.sqrt(D) + (0 if bias is None else bias(T, T))
        scores = scores.masked_fill(~allowed, float("-inf"))
        expected = scores.softmax(-1) @ v
        window = sliding_window(real, B, T, radius, n_global, causal, bias, torch.float64)
        got = sliding_window_attention(q, k, v, window)
        seen = allowed.expand(B, H, T, T).any(-1)  # queries with a key in reach; the others: finite, whatever they hold
        torch.testing.assert_close(got[seen], expected[seen], atol=1e-12, rtol=1e-12)
        # without globals, example 2 has such queries
        assert torch.isfinite(got).all() and (n_global > 0 or not seen.all())
        got.square().sum().backward()
        assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


@pytest.mark.parametrize("positions", ["learned", "rope", "alibi"])
def test_local_attention_in_the_trunk_equals_full_attention_when_its_window_covers_the_input(positions):
    """A window at least as long as the input is full attention (the same outputs, exactly); a shorter one makes each
    token's output independent of tokens beyond its reach through the stack (the receptive field: layers x radius),
    except through the global [CLS]; padding still changes nothing at real tokens."""
    torch.manual_seed(0)
    common = dict(vocab_size=50, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_len=64, positions=positions)
    full = Trunk(Backbone(TrunkConfig(**common)), {"text": TokenStem(TrunkConfig(**common))}).eval()
    init_weights(full)
    ids = torch.randint(5, 50, (2, 40))
    wide = TrunkConfig(**common, local_window=40)
    windowed = Trunk(Backbone(wide), {"text": TokenStem(wide)}).eval()
    windowed.load_state_dict(full.state_dict())
    with torch.no_grad():
        assert torch.equal(windowed(ids), full(ids))
        local = TrunkConfig(**common, local_window=4, global_tokens=0)
        windowed = Trunk(Backbone(local), {"text": TokenStem(local)}).eval()
        windowed.load_state_dict(full.state_dict())
        changed = ids.clone()
        changed[:, 30] = (changed[:, 30] + 1 - 5) % 45 + 5
        before, after = windowed(ids), windowed(changed)
        moved = (before - after).abs().amax(-1) > 1e-6  # (B, T): the positions the change reached
        assert moved[:, 22:39].all() and not moved[:, :22].any()  # 2 layers x radius 4 = 8 positions each way
        padded = windowed(
            torch.cat([ids, torch.zeros(2, 9, dtype=torch.long)], 1),
            torch.cat([torch.ones(2, 40), torch.zeros(2, 9)], 1),
        )
        torch.testing.assert_close(padded[:, :40], before, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("positions", ["rope", "t5"])
def test_a_forked_pass_with_local_attention_equals_its_rows_alone(positions):
    """``fork=(layer, rows)`` (several tasks' deltas on shared inputs) changes the batch inside the stack: local
    attention's masks (padding, the position bias) follow the rows taken, repeats included."""
    torch.manual_seed(0)
    cfg = TrunkConfig(vocab_size=50, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_len=64, positions=positions,
                      local_window=4, global_tokens=1)
    trunk = Trunk(Backbone(cfg), {"text": TokenStem(cfg)}).eval()
    init_weights(trunk)
    ids = torch.randint(5, 50, (3, 30))
    mask = torch.ones(3, 30)
    mask[1, 20:] = 0
    mask[2, 9:] = 0
    rows = torch.tensor([2, 0, 2, 1])
    with torch.no_grad():
        forked, alone = trunk(ids, mask, fork=(1, rows)), trunk(ids[rows], mask[rows])
    real = mask[rows].bool()
    torch.testing.assert_close(forked[real], alone[real], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("positions", ["alibi", "t5", "rope", "disentangled"])
def test_a_decoder_with_a_position_bias_decodes_step_by_step_as_in_one_pass(positions):
    from trunk.models import Decoder

    torch.manual_seed(0)
    cfg = TrunkConfig(vocab_size=40, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_len=32, positions=positions)
    decoder = Decoder(cfg).eval()
    init_weights(decoder)
    if positions == "t5":
        nn.init.normal_(decoder.position_bias.embedding.weight, std=1.0)
    ids, memory = torch.randint(5, 40, (2, 9)), torch.randn(2, 6, 32)
    cache = decoder.new_cache()
    with torch.no_grad():
        steps = torch.cat([decoder(ids[:, i:i + 1], memory, cache=cache) for i in range(9)], dim=1)
        torch.testing.assert_close(steps, decoder(ids, memory), atol=1e-5, rtol=1e-5)


def test_init_follows_bert_gpt():
    cfg = TrunkConfig(vocab_size=2000, d_model=64, n_layers=4, n_heads=4, d_ff=256)
    trunk = Trunk(Backbone(cfg), {"text": TokenStem(cfg)})
    init_weights(trunk, std=0.02)
    assert trunk.stems["text"].token.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert trunk.backbone.blocks[0].ff.fc_in.bias.abs().sum() == 0
    # residual projections scaled by 1/sqrt(2 * n_layers)
    assert trunk.backbone.blocks[0].ff.fc_out.weight.std().item() == pytest.approx(0.02 / math.sqrt(8), rel=0.1)


def test_causal_attention_ignores_future_tokens():
    torch.manual_seed(0)
    cfg = TrunkConfig(vocab_size=50, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_len=16)
    backbone = Backbone(cfg).eval()
    x = torch.randn(1, 8, 32)
    y = x.clone()
    y[:, 5:] = torch.randn(1, 3, 32)
    torch.testing.assert_close(backbone(x, causal=True)[:, :5], backbone(y, causal=True)[:, :5])


def test_grad_checkpointing_gives_same_gradients():
    torch.manual_seed(0)
    cfg = TrunkConfig(vocab_size=50, d_model=32, n_layers=2, n_heads=4, d_ff=64, dropout=0.0, attn_dropout=0.0)
    backbone = Backbone(cfg)
    x = torch.randn(2, 5, 32)
    backbone(x).sum().backward()
    expected = [p.grad.clone() for p in backbone.parameters()]
    backbone.zero_grad()
    backbone.set_grad_checkpointing(True)
    backbone(x).sum().backward()
    for g, p in zip(expected, backbone.parameters()):
        torch.testing.assert_close(p.grad, g)


def test_bad_configs_fail_clearly():
    with pytest.raises(ValueError, match="not divisible by n_heads"):
        TrunkConfig(d_model=30, n_heads=4)
    cfg = TrunkConfig(vocab_size=50, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_len=8)
    with pytest.raises(ValueError, match="exceeds the trunk's max_len=8"):
        TokenStem(cfg)(torch.zeros(1, 9, dtype=torch.long))
    with pytest.raises(ValueError, match="pooling"):
        SequenceClassificationHead(16, 2, pooling="min")


def test_max_pooling_takes_each_channels_largest_real_value():
    hidden = torch.tensor([[[1.0, -5.0], [3.0, -2.0], [9.0, 9.0]]])  # the third token is padding
    mask = torch.tensor([[1, 1, 0]])
    torch.testing.assert_close(pool(hidden, mask, "max"), torch.tensor([[3.0, -2.0]]))
    torch.testing.assert_close(pool(hidden, None, "max"), torch.tensor([[9.0, 9.0]]))


def test_cls_pooling_reads_the_first_token():
    head = SequenceClassificationHead(8, 2, pooling="cls", dropout=0.0)
    hidden = torch.randn(1, 4, 8)
    changed = hidden.clone()
    changed[:, 1:] += 1.0
    torch.testing.assert_close(head(hidden), head(changed))


def test_a_head_without_pooler_is_one_linear_layer_on_the_pooled_vector():
    head = SequenceClassificationHead(8, 3, pooling="mean", dropout=0.0, pooler=False)
    assert [name for name, _ in head.named_parameters()] == ["classifier.weight", "classifier.bias"]
    hidden, mask = torch.randn(2, 4, 8), torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    torch.testing.assert_close(head(hidden, mask), head.classifier(pool(hidden, mask, "mean")))


def test_fast_dropout_drops_the_right_fraction_and_scales_the_rest():
    from trunk.models import dropout

    torch.manual_seed(0)
    x = torch.ones(1_000_001, requires_grad=True)  # odd: one 32-bit draw serves two elements
    y = dropout(x, 0.1)
    dropped = (y == 0).float().mean().item()
    assert dropped == pytest.approx(0.1, abs=0.002)
    assert torch.allclose(y[y != 0], torch.tensor(1 / 0.9))
    y.sum().backward()
    torch.testing.assert_close(x.grad, y.detach())  # the gradient passes exactly where the value did
    torch.manual_seed(0)
    torch.testing.assert_close(dropout(torch.ones(1_000_001), 0.1), y.detach())  # reproducible from the seed
    z = torch.randn(5, 7)
    assert dropout(z, 0.1, training=False) is z and dropout(z, 0.0) is z
    assert (dropout(z, 1.0) == 0).all()
    assert dropout(z.bfloat16(), 0.5).dtype == torch.bfloat16


def test_written_out_attention_is_attention_when_nothing_is_dropped():
    """The written-out path that CPU training and decoding steps (one query) take computes what SDPA computes."""
    import torch.nn.functional as F

    from trunk.models.kernels import attention_written_out

    torch.manual_seed(0)
    q, k, v = torch.randn(3, 2, 5, 8), torch.randn(3, 2, 6, 8), torch.randn(3, 2, 6, 8)
    mask = torch.ones(3, 1, 1, 6, dtype=torch.bool)
    mask[1, ..., 4:] = False
    torch.testing.assert_close(
        attention_written_out(q, k, v, mask, 0.0), F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    )
    one = q[:, :, -1:]
    torch.testing.assert_close(
        attention_written_out(one, k, v, mask, 0.0), F.scaled_dot_product_attention(one, k, v, attn_mask=mask)
    )
    out = attention_written_out(q, k, v, mask, 0.5)
    assert out.shape == (3, 2, 5, 8) and not torch.allclose(out, attention_written_out(q, k, v, mask, 0.0))


def outputs_and_gradients(trunk, ids, mask, loss) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The trunk's outputs at the real tokens (zeros at padding), and every parameter's gradient of ``loss`` of them."""
    trunk.zero_grad()
    out = trunk(ids, mask) * mask[..., None]
    loss(out).backward()
    return out, {n: p.grad.clone() for n, p in trunk.named_parameters()}


def assert_same_outputs_and_gradients(first, second, atol: float, rtol: float, gradient_rtol: float) -> None:
    """Two ``outputs_and_gradients`` results agree: the outputs within (atol, rtol), each gradient within (atol,
    gradient_rtol), named where it does not."""
    torch.testing.assert_close(first[0], second[0], atol=atol, rtol=rtol)
    for name, gradient in second[1].items():
        torch.testing.assert_close(first[1][name], gradient, atol=atol, rtol=gradient_rtol, msg=name)


@pytest.mark.parametrize("positions", ["learned", "rope", "t5"])
def test_computing_on_real_tokens_only_gives_the_padded_results_and_gradients(positions, monkeypatch):
    """The backbone skips padding (``Unpadded``); the outputs at real tokens and every gradient are
    those of the plain padded computation."""
    from trunk.models import Unpadded

    torch.manual_seed(0)
    cfg = TrunkConfig(vocab_size=50, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_len=32, positions=positions)
    trunk = Trunk(Backbone(cfg), {"text": TokenStem(cfg)}).eval()
    init_weights(trunk)
    trunk.double()  # the two paths sum in different orders (attention by length groups): float32 rounding apart
    ids = torch.randint(5, 50, (3, 12))
    mask = torch.ones_like(ids)
    mask[0, 7:] = 0
    mask[2, 3:] = 0

    def run():
        return outputs_and_gradients(trunk, ids, mask, lambda out: out.square().sum())

    assert Unpadded.pays(mask.bool())
    rows = Unpadded(mask.bool())
    assert (rows.real, rows.index.numel()) == (22, 24)  # two padding positions computed along: a round row count
    assert trunk(ids, mask)[~mask.bool()].abs().max() == 0  # and dropped: zeros at the padding
    unpadded = run()
    monkeypatch.setattr(Unpadded, "pays", staticmethod(lambda mask: False))
    assert_same_outputs_and_gradients(unpadded, run(), atol=1e-5, rtol=1e-5, gradient_rtol=1e-4)


@pytest.mark.parametrize("positions", ["learned", "rope"])
def test_attention_by_length_groups_is_the_padded_batchs_attention(positions, monkeypatch):
    """Self-attention runs per group of like-length examples, each padded to its own longest (``LengthGroups``):
    with padding on the right, on the left and inside a row, every output and gradient is the padded batch's (in
    float64, where only the summation order could differ)."""
    from trunk.models import Unpadded
    from trunk.models.kernels import LengthGroups

    torch.manual_seed(0)
    cfg = TrunkConfig(vocab_size=50, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_len=40, positions=positions)
    trunk = Trunk(Backbone(cfg), {"text": TokenStem(cfg)}).double().eval()
    ids = torch.randint(5, 50, (6, 32))
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[0, 30:] = mask[1, 20:] = mask[2, 9:] = mask[3, 4:] = mask[5, 12:] = False
    mask[4, :3] = mask[5, 5:7] = False  # left padding; a hole inside a row

    def run():
        return outputs_and_gradients(trunk, ids, mask, lambda out: out.sin().sum())

    groups = Unpadded(mask).groups
    assert [(g.size, g.length) for g in groups.parts] == [(2, 32), (1, 20), (2, 12), (1, 4)]
    assert groups.parts[0].mask is not None and groups.parts[3].mask is None  # a group of full rows masks nothing
    grouped = run()
    monkeypatch.setattr(Unpadded, "groups", property(lambda self: None))
    assert_same_outputs_and_gradients(grouped, run(), atol=1e-12, rtol=1e-10, gradient_rtol=1e-10)
    monkeypatch.undo()
    monkeypatch.setattr(LengthGroups, "PAYS", 0.1)  # where grouping saves too little, the padded batch is used
    assert Unpadded(mask).groups is None


def test_real_token_rows_come_in_few_sizes_at_little_cost():
    """The real-token path's row counts are rounded (a heap fragments under tensors whose sizes differ by every
    token): at most a sixteenth more rows, and a few sizes per doubling of the tokens."""
    from trunk.models.kernels import rounded

    sizes = {rounded(n) for n in range(1024, 2048)}
    assert len(sizes) <= 32 and all(n <= rounded(n) <= n * 17 / 16 + 8 for n in range(1, 20000))


def test_the_decoder_on_real_target_tokens_only_matches_the_padded_decoder():
    from trunk.models import Decoder

    torch.manual_seed(0)
    cfg = TrunkConfig(vocab_size=40, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_len=32)
    decoder = Decoder(cfg).eval()
    init_weights(decoder)
    ids, memory = torch.randint(5, 40, (3, 10)), torch.randn(3, 6, 32)
    memory_mask = torch.ones(3, 6, dtype=torch.bool)
    memory_mask[1, 4:] = False
    target_mask = torch.ones(3, 10, dtype=torch.bool)
    target_mask[0, 6:] = False
    target_mask[2, 2:] = False

    def run(mask):
        decoder.zero_grad()
        hidden = decoder.hidden(ids, memory, memory_mask, target_mask=mask)[target_mask]
        decoder.logits(hidden).logsumexp(-1).sum().backward()
        return hidden, {n: p.grad.clone() for n, p in decoder.named_parameters()}

    unpadded, unpadded_grads = run(target_mask)
    padded, padded_grads = run(None)
    torch.testing.assert_close(unpadded, padded, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(
        decoder.logits(unpadded), decoder(ids, memory, memory_mask)[target_mask], atol=1e-5, rtol=1e-5
    )
    for name in padded_grads:
        torch.testing.assert_close(unpadded_grads[name], padded_grads[name], atol=1e-5, rtol=1e-4, msg=name)


def test_a_preset_names_a_shape_and_the_fields_given_win():
    from trunk.models.trunk import PRESETS, SHAPE_DEFAULTS

    base = TrunkConfig.from_name("base", dropout=0.2)
    assert {k: getattr(base, k) for k in PRESETS["base"]} == PRESETS["base"] and base.dropout == 0.2
    assert TrunkConfig(preset="small", n_layers=4).n_layers == 4 and TrunkConfig(preset="small").n_layers == 2
    assert {k: getattr(TrunkConfig(), k) for k in SHAPE_DEFAULTS} == SHAPE_DEFAULTS  # no preset: the defaults
    assert TrunkConfig.from_dict(base.to_dict()) == base  # stored configs hold every value, and rebuild the same
    with pytest.raises(ValueError, match="preset='huge': the presets are tiny, small, base"):
        TrunkConfig(preset="huge")


def test_a_new_position_scheme_is_one_class_and_every_part_of_the_trunk_uses_it():
    """A scheme (here: a fixed table that marks only the first token) plugs in by name: the stems add its table, the
    config accepts it, and a pretrained trunk's max_len is checked only when the scheme fixes it."""
    from trunk.formats.trunk_dir import architecture_fields
    from trunk.models.positions import POSITIONS, PositionScheme

    class FirstToken(PositionScheme):
        name = "first_token"

        @staticmethod
        def add_token_table(stem, max_len, dim):
            stem.register_buffer(
                "position_table", torch.zeros(max_len, dim).index_fill_(0, torch.tensor([0]), 1.0), persistent=False
            )

        @staticmethod
        def token_table(stem, start, stop):
            return stem.position_table[start:stop]

    try:
        cfg = TrunkConfig(
            vocab_size=20, d_model=8, n_layers=1, n_heads=2, d_ff=16, max_len=8, positions="first_token", dropout=0.0
        )
        stem = build_trunk(cfg).stems["text"]
        ids = torch.tensor([[3, 3, 3]])
        assert torch.allclose(stem(ids)[0, 0] - stem(ids)[0, 1], torch.ones(8))  # only the first position is marked
        assert "max_len" not in architecture_fields(cfg) and "max_len" in architecture_fields(
            TrunkConfig(positions="learned")
        )
    finally:
        POSITIONS.pop("first_token")
    with pytest.raises(ValueError, match="positions='first_token': choose ") as err:
        TrunkConfig(positions="first_token")
    assert all(name in str(err.value) for name in ("learned", "sinusoidal", "rope", "alibi", "t5"))


def test_rms_norm_and_the_gated_feed_forward_compute_t5s_layer():
    """rms_norm and gated_ff: each block's norms are RMSNorms (a gain, no bias) and its feed-forward is
    act(x W_gate) * x W_in, written out here; a LoRA delta and its norm shifts merge into such a trunk exactly."""
    from trunk.models import TrunkConfig, build_trunk

    torch.manual_seed(0)
    cfg = TrunkConfig(vocab_size=50, d_model=16, n_layers=2, n_heads=2, d_ff=32, max_len=16, positions="t5",
                      norm="pre", rms_norm=True, gated_ff=True, activation="gelu_tanh", dropout=0.0, attn_dropout=0.0)
    trunk = build_trunk(cfg).eval()
    block = trunk.backbone.blocks[0]
    assert isinstance(block.norm_attn, torch.nn.RMSNorm) and isinstance(trunk.backbone.final_norm, torch.nn.RMSNorm)
    x = torch.randn(3, 5, 16)
    ff = block.ff
    expected = ff.fc_out(torch.nn.functional.gelu(ff.fc_gate(x), approximate="tanh") * ff.fc_in(x))
    assert torch.allclose(ff(x), expected)
    rms = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.layer_norm_eps) * block.norm_attn.weight
    assert torch.allclose(block.norm_attn(x), rms, atol=1e-6)
    assert trunk.flops_per_token(8, train=False) > build_trunk(
        TrunkConfig(**{**cfg.to_dict(), "gated_ff": False})).flops_per_token(8, train=False)

    assert_lora_with_norm_shifts_merges_exactly(trunk, torch.randint(5, 50, (2, 7)))


def assert_lora_with_norm_shifts_merges_exactly(trunk, ids, mask=None) -> None:
    """A random LoRA on the queries and the feed-forward's gate, with norm shifts, routed and then merged into the
    trunk's weights: the same outputs."""
    from trunk.models.deltas import DeltaConfig, DeltaRouter, TaskDelta

    router = DeltaRouter()
    delta = TaskDelta(trunk.backbone, DeltaConfig(method="lora", r=2, norms=True, targets=("fc_gate", "q_proj")))
    with torch.no_grad():
        for p in delta.parameters():
            p.normal_(std=0.1)
    router.add("t", delta)
    router.attach(trunk.backbone)
    with torch.no_grad(), router.route([("t", None)]):
        routed = trunk(ids, mask)
        router.merge(trunk.backbone, "t")
        assert torch.allclose(routed, trunk(ids, mask), atol=1e-5)


def test_a_bias_free_trunk_computes_a_biased_one_with_zero_biases():
    """bias: false (ModernBERT's): no bias in any block's linears or norms, the stem's norm or an MLM head's norm; it
    computes what a trunk with biases computes when they are zero; int8 layers and a LoRA with norm shifts (merged)
    run on it."""
    from trunk.inference.quantize import Int8Linear
    from trunk.tasks.objectives.masked_lm import tied_mlm_head

    torch.manual_seed(0)
    cfg = TrunkConfig(vocab_size=50, d_model=16, n_layers=2, n_heads=2, d_ff=32, max_len=16, positions="rope",
                      norm="pre", embedding_norm=True, gated_ff=True, bias=False, dropout=0.0, attn_dropout=0.0)
    trunk = build_trunk(cfg).eval()
    assert not [name for name, _ in trunk.named_parameters() if name.endswith("bias")]
    assert tied_mlm_head(trunk).norm.bias is None
    biased = build_trunk(TrunkConfig(**{**cfg.to_dict(), "bias": True})).eval()
    missing = biased.load_state_dict(trunk.state_dict(), strict=False).missing_keys
    assert missing and all(name.endswith("bias") for name in missing)
    with torch.no_grad():
        for name in missing:
            biased.get_parameter(name).zero_()
    ids, mask = torch.randint(5, 50, (2, 7)), torch.tensor([[1] * 7, [1] * 4 + [0] * 3])
    with torch.no_grad():
        out = trunk(ids, mask)
        assert torch.allclose(out, biased(ids, mask), atol=1e-6)
        linear = trunk.backbone.blocks[0].attn.q_proj
        assert Int8Linear.from_float(linear).bias is None
    assert_lora_with_norm_shifts_merges_exactly(trunk, ids, mask)


def test_shared_blocks_apply_their_weights_at_every_layer_of_their_group():
    """shared_blocks (ALBERT's): 4 layers over 2 blocks hold 2 blocks' weights, compute block 0 twice then block 1
    twice, and give freezing and layer-wise rates one depth group per distinct block; a count that does not divide
    the depth is refused."""
    torch.manual_seed(0)
    cfg = TrunkConfig(vocab_size=50, d_model=16, n_layers=4, n_heads=2, d_ff=32, max_len=16, positions="learned",
                      norm="post", shared_blocks=2, dropout=0.0, attn_dropout=0.0)
    trunk = build_trunk(cfg).eval()
    own = build_trunk(TrunkConfig(**{**cfg.to_dict(), "shared_blocks": 0}))
    per_block = sum(p.numel() for p in own.backbone.blocks[0].parameters())
    assert sum(p.numel() for p in own.parameters()) - sum(p.numel() for p in trunk.parameters()) == 2 * per_block
    assert [cfg.block_of(i) for i in range(4)] == [0, 0, 1, 1] and len(trunk.depth_groups()) == 2 + 2
    ids = torch.randint(5, 50, (2, 6))
    with torch.no_grad():
        x = trunk.stems["text"](ids)
        for i in (0, 0, 1, 1):
            x = trunk.backbone.blocks[i](x)
        assert torch.allclose(trunk(ids), x, atol=1e-6)
    with pytest.raises(ValueError, match="shared_blocks=3 must divide n_layers=4"):
        TrunkConfig(**{**cfg.to_dict(), "shared_blocks": 3})
