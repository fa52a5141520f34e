"""Small real PyTorch programs dumped with tb-numerics, run as a subprocess by the tests,
and small models the torch tests share.

``python tests/torch_programs.py fp16_overflow DUMP_DIR``
"""

import sys

import torch
from torch import nn

from tb_numerics_plugin import torch as tbn


class SqrtWeight(nn.Module):
    """A finite loss whose gradient is +inf: d sqrt(w)/dw at w = 0."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.tensor([0.0, 1.0, 4.0]))

    def forward(self, x):
        return (torch.sqrt(self.w) * x).sum()


class Wide(nn.Module):
    """A float16 Linear whose large weights bring activations near 65504, then past it."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 8, bias=False).half()
        with torch.no_grad():
            self.linear.weight.fill_(5000.0)

    def forward(self, x):
        h = self.linear(x)  # 8 * 5000 * 1 = 40000: finite, within a factor 2 of 65504
        return h * 2.0  # 80000 > 65504: +inf in float16


def fp16_overflow(dump_dir):
    """Dumps two steps of ``Wide`` in FULL_NUMERICS: headroom alerts, then +inf."""
    model = Wide()
    x = torch.ones(4, 8, dtype=torch.float16)
    with tbn.enable_dump_debug_info(dump_dir, tensor_debug_mode="FULL_NUMERICS",
                                    circular_buffer_size=-1):
        for _ in range(2):
            out = model(x)
    print("max", out.max().item())


if __name__ == "__main__":
    {"fp16_overflow": fp16_overflow}[sys.argv[1]](sys.argv[2])
