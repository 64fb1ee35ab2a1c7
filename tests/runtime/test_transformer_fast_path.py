"""nn.MultiheadAttention / nn.TransformerEncoderLayer in eval without autograd take a fused fast path on
CPU and on tpu: same outputs and attention weights as CPU's."""

from __future__ import annotations

import pytest
import torch


def _pair(module):
    torch.manual_seed(0)
    ref = module().eval()
    torch.manual_seed(0)
    return ref, module().to("tpu").eval()


def _close(a, b):
    if isinstance(a, tuple):
        for x, y in zip(a, b):
            _close(x, y)
        return
    if a is None:
        assert b is None
        return
    torch.testing.assert_close(b.cpu(), a, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    "call",
    [
        lambda m, x, y: m(x, x, x),
        lambda m, x, y: m(x, x, x, need_weights=False),
        lambda m, x, y: m(x, x, x, average_attn_weights=False),
        lambda m, x, y: m(x, y, y),
        lambda m, x, y: m(x, y, x[:, : y.shape[1]]),
        lambda m, x, y: m(x, x, x, key_padding_mask=torch.tensor([[False] * 5, [False] * 3 + [True] * 2])),
        lambda m, x, y: m(x, x, x, attn_mask=torch.ones(5, 5, dtype=torch.bool).triu(1)),
        lambda m, x, y: m(
            x,
            x,
            x,
            attn_mask=torch.ones(5, 5, dtype=torch.bool).triu(1),
            key_padding_mask=torch.tensor([[False] * 5, [False] * 4 + [True]]),
        ),  # fmt: skip
    ],
)
def test_multihead_attention_fast_path_matches_cpu(call):
    ref, dev = _pair(lambda: torch.nn.MultiheadAttention(8, 2, batch_first=True))
    x, y = torch.randn(2, 5, 8), torch.randn(2, 3, 8)

    def to_tpu(m, a, b):
        def wrapped(*args, **kw):
            moved = [t.to("tpu") for t in args]
            kw = {k: v.to("tpu") if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
            return m(*moved, **kw)

        return call(wrapped, a, b)

    with torch.no_grad():
        expected = call(ref, x, y)
        got = to_tpu(dev, x, y)
    if got[1] is not None and got[1].numel() == 0:
        assert expected[1] is None or expected[1].numel() == 0
        got, expected = got[:1], expected[:1]
    _close(expected, got)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("causal", [False, True])
def test_transformer_encoder_layer_fast_path_matches_cpu(norm_first, activation, causal):
    ref, dev = _pair(
        lambda: torch.nn.TransformerEncoderLayer(
            8, 2, 16, batch_first=True, norm_first=norm_first, activation=activation
        )
    )
    x = torch.randn(2, 5, 8)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(5) if causal else None
    with torch.no_grad():
        expected = ref(x, src_mask=mask, is_causal=causal)
        got = dev(x.to("tpu"), src_mask=None if mask is None else mask.to("tpu"), is_causal=causal)
    _close(expected, got)
