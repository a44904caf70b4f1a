"""The upscale nets in plain torch, as published (BasicSR's `rrdbnet_arch.py` and
`srvgg_arch.py`); parameter names are the new-layout keys (workers/models/upscale `esrgan_names`).

Both take images [B, C, H, W] in 0..1 and give [B, C', H·s, W·s] (unclamped).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from workers.models.upscale import UpscaleSpec

SLOPE = 0.2  # every LeakyReLU of ESRGAN
RESIDUAL = 0.2  # ESRGAN's residual scaling (dense block and RRDB)


def _conv(c_in: int, c_out: int) -> nn.Conv2d:
    return nn.Conv2d(c_in, c_out, 3, 1, 1)


class ResidualDenseBlock(nn.Module):
    """Five 3×3 convs, each reading the block input and every earlier output (growth gc)."""

    def __init__(self, nf: int, gc: int) -> None:
        super().__init__()
        self.conv1, self.conv2 = _conv(nf, gc), _conv(nf + gc, gc)
        self.conv3, self.conv4 = _conv(nf + 2 * gc, gc), _conv(nf + 3 * gc, gc)
        self.conv5 = _conv(nf + 4 * gc, nf)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1 = F.leaky_relu(self.conv1(x), SLOPE)
        x2 = F.leaky_relu(self.conv2(torch.cat((x, x1), 1)), SLOPE)
        x3 = F.leaky_relu(self.conv3(torch.cat((x, x1, x2), 1)), SLOPE)
        x4 = F.leaky_relu(self.conv4(torch.cat((x, x1, x2, x3), 1)), SLOPE)
        x5 = self.conv5(torch.cat((x, x1, x2, x3, x4), 1))
        return x5 * RESIDUAL + x


class RRDB(nn.Module):
    """Residual in residual dense block: three dense blocks, scaled, plus the input."""

    def __init__(self, nf: int, gc: int) -> None:
        super().__init__()
        self.rdb1, self.rdb2, self.rdb3 = (ResidualDenseBlock(nf, gc) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rdb3(self.rdb2(self.rdb1(x))) * RESIDUAL + x


class RRDBNet(nn.Module):
    """ESRGAN / Real-ESRGAN: (unshuffle) → conv_first → nb RRDBs + conv_body (a long skip) →
    `upsamples` × (nearest ×2 → conv → lrelu) → conv_hr → lrelu → conv_last."""

    def __init__(self, spec: UpscaleSpec) -> None:
        super().__init__()
        nf, gc, u = spec.features, spec.growth, spec.unshuffle
        self.unshuffle, self.upsamples = u, spec.upsamples
        self.conv_first = _conv(spec.in_channels * u * u, nf)
        self.body = nn.Sequential(*(RRDB(nf, gc) for _ in range(spec.blocks)))
        self.conv_body = _conv(nf, nf)
        for k in range(1, spec.upsamples + 1):
            self.add_module(f"conv_up{k}", _conv(nf, nf))
        self.conv_hr = _conv(nf, nf)
        self.conv_last = _conv(nf, spec.out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feat = F.pixel_unshuffle(x, self.unshuffle) if self.unshuffle > 1 else x
        feat = self.conv_first(feat)
        feat = feat + self.conv_body(self.body(feat))
        for k in range(1, self.upsamples + 1):
            up = getattr(self, f"conv_up{k}")
            feat = F.leaky_relu(up(F.interpolate(feat, scale_factor=2, mode="nearest")), SLOPE)
        return self.conv_last(F.leaky_relu(self.conv_hr(feat), SLOPE))


class SRVGGNetCompact(nn.Module):
    """Real-ESRGAN's compact net: conv, PReLU, `blocks` × (conv, PReLU), conv to C·s² channels,
    pixel shuffle by s, plus the input upscaled nearest."""

    def __init__(self, spec: UpscaleSpec) -> None:
        super().__init__()
        nf, c, s = spec.features, spec.in_channels, spec.scale
        layers: list[nn.Module] = [_conv(c, nf), nn.PReLU(nf)]
        for _ in range(spec.blocks):
            layers += [_conv(nf, nf), nn.PReLU(nf)]
        layers.append(_conv(nf, spec.out_channels * s * s))
        self.body = nn.Sequential(*layers)
        self.scale = s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.pixel_shuffle(self.body(x), self.scale)
        return out + F.interpolate(x, scale_factor=self.scale, mode="nearest")


def build(spec: UpscaleSpec) -> nn.Module:
    """An untrained net of `spec`'s shape (its weights come from the file)."""
    return RRDBNet(spec) if spec.arch == "esrgan" else SRVGGNetCompact(spec)
