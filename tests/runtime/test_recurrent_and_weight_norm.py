"""nn.LSTM/GRU (and their cells), weight norm and QR on tpu: forward and gradients match CPU."""

from __future__ import annotations

import pytest
import torch


def _forward_backward(module, *inputs):
    out = module(*inputs)
    first = out[0] if isinstance(out, tuple) else out
    loss = first.square().sum()
    if isinstance(out, tuple) and isinstance(out[1], tuple):  # LSTM: (h, c)
        loss = loss + sum(t.square().sum() for t in out[1])
    elif isinstance(out, tuple):
        loss = loss + out[1].square().sum()
    loss.backward()
    return first


def _compare(make, *shapes, atol=1e-5):
    torch.manual_seed(0)
    ref = make()
    torch.manual_seed(0)
    dev = make().to("tpu")
    xs = [torch.randn(*s, requires_grad=True) for s in shapes]
    dxs = [x.detach().to("tpu").requires_grad_() for x in xs]
    out = _forward_backward(ref, *xs)
    dev_out = _forward_backward(dev, *dxs)
    torch.testing.assert_close(dev_out.cpu(), out.detach(), atol=atol, rtol=1e-4)
    for x, dx in zip(xs, dxs):
        torch.testing.assert_close(dx.grad.cpu(), x.grad, atol=atol, rtol=1e-4)
    for (name, p), q in zip(ref.named_parameters(), dev.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, atol=atol, rtol=1e-4, msg=name)


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.nn.LSTM(6, 5, num_layers=2, batch_first=True),
        lambda: torch.nn.LSTM(6, 5, bidirectional=True, bias=False),
        lambda: torch.nn.GRU(6, 5, num_layers=2, batch_first=True),
        lambda: torch.nn.GRU(6, 5, bidirectional=True, bias=False),
    ],
)
def test_recurrent_layers_match_cpu(make):
    _compare(make, (3, 4, 6))


@pytest.mark.parametrize("make", [lambda: torch.nn.LSTMCell(6, 5), lambda: torch.nn.GRUCell(6, 5)])
def test_recurrent_cells_match_cpu(make):
    _compare(make, (3, 6))


@pytest.mark.parametrize(
    "wrap",
    [
        lambda m: torch.nn.utils.parametrizations.weight_norm(m),
        lambda m: torch.nn.utils.parametrizations.weight_norm(m, dim=1),
        lambda m: torch.nn.utils.weight_norm(m),
    ],
)
def test_weight_norm_forward_and_gradients_match_cpu(wrap):
    """Wav2Vec2/HuBERT's positional convolution is weight-normed: training it needs the backward."""
    _compare(lambda: wrap(torch.nn.Conv1d(4, 6, 3)), (2, 4, 9))


@pytest.mark.parametrize("mode", ["reduced", "complete", "r"])
@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (2, 4, 4)])
def test_qr_matches_cpu(mode, shape):
    a = torch.randn(*shape)
    q, r = torch.linalg.qr(a.to("tpu"), mode=mode)
    q_ref, r_ref = torch.linalg.qr(a, mode=mode)
    torch.testing.assert_close(r.cpu(), r_ref, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(q.cpu(), q_ref, atol=1e-5, rtol=1e-4)


def test_orthogonal_init_on_tpu():
    w = torch.empty(6, 4, device="tpu")
    torch.nn.init.orthogonal_(w)
    torch.testing.assert_close((w.T @ w).cpu(), torch.eye(4), atol=1e-5, rtol=1e-5)
