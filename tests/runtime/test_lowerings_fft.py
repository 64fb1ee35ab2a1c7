"""torch.fft on tpu vs CPU: the r2c, c2c and c2r primitives under each normalization."""

from __future__ import annotations

import pytest
import torch


@pytest.mark.parametrize("norm", [None, "ortho", "forward", "backward"])
def test_fft_family_matches_cpu(norm):
    x = torch.randn(3, 8, 6)
    z = torch.randn(3, 8, 6, dtype=torch.complex64)
    d, dz = x.to("tpu"), z.to("tpu")
    cases = [
        (lambda t: torch.fft.rfft(t, norm=norm), x, d),
        (lambda t: torch.fft.rfftn(t, dim=(1, 2), norm=norm), x, d),
        (lambda t: torch.fft.fft(t, norm=norm), z, dz),
        (lambda t: torch.fft.ifft2(t, norm=norm), z, dz),
        (lambda t: torch.fft.fft(t, dim=1, norm=norm), x, d),
        (lambda t: torch.fft.irfft(t, n=10, norm=norm), z, dz),
        (lambda t: torch.fft.irfftn(t, dim=(1, 2), norm=norm), z, dz),
    ]
    for fn, cpu, dev in cases:
        want = fn(cpu)
        got = fn(dev).cpu()
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_fft_round_trip_and_autograd_free_use_in_a_model_layer():
    """FNet-style mixing: real part of a 2-D FFT over (seq, hidden)."""
    x = torch.randn(2, 16, 32)
    want = torch.fft.fftn(x, dim=(1, 2)).real
    got = torch.fft.fftn(x.to("tpu"), dim=(1, 2)).real.cpu()
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
