"""The training steps the capture benches time, each built fresh by a factory of its own.

``WORKLOADS`` maps a workload's name to ``(factory, kind)``: the factory builds a new
instance (its model, optimizer and inputs, seeded alike) and returns ``(model, step)``,
where ``step()`` runs one step of it; the kind tells ``capture_overhead.py`` which
configurations to time and which table to print. Every workload runs on CPU.

- ``MLP (demo)`` (``step``): one training step of the torch demo's MLP (784-500-10,
  batch 100, SGD). The model users meet first; its few ops are small, so the host
  time the capture adds per op is a large share of its step.
- ``MLP (foreach Adam)`` (``step``): the same MLP trained by ``Adam(foreach=True)``,
  the optimizer a CUDA step runs by default: in-place ops over lists of tensors that
  return nothing, whose outputs the capture takes from the arguments they wrote.
- ``Transformer encoder`` (``step``): one training step of ``nn.TransformerEncoder``
  (d_model 256, 4 heads, 4 layers, FF 1024, batch 16x128, Adam). Larger kernels and
  deeper module nesting: the share of a step a capture adds on a realistic model.
- ``Tight loop`` (``per_op``): the forward of a module that runs ``TIGHT_LOOP_OPS``
  tiny ops (``y = y + 1`` on 10 float32 values that require grad, so anomaly mode
  records each op as in training; no backward). Its kernels cost next to nothing,
  so the time a capture adds to it is host time per captured op.
- ``Transformer encoder (compiled)`` (``compiled``): the encoder's training step with
  the module compiled in place by ``torch.compile`` (inductor, CPU): the capture must
  keep a compiled model compiled, with health in its graphs. The factory runs one
  untimed step to compile it and raises ``CompileFailed`` when that fails (no C++
  compiler, say).
"""

import functools

import torch
from torch import nn

from tb_numerics_plugin.demo import torch_mnist

TIGHT_LOOP_OPS = 2000


class CompileFailed(Exception):
    """torch.compile could not build the compiled workload on this machine."""


class Encoder(nn.Module):
    """A training-mode ``nn.TransformerEncoder`` (no dropout) whose loss is the mean square
    of its output; the benches' sizes by default (step_windows.py takes a smaller one)."""

    def __init__(self, d_model=256, heads=4, feedforward=1024, layers=4):
        super().__init__()
        layer = nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=feedforward,
                                           dropout=0.0, batch_first=True)
        # the nested-tensor fast path is inference-only; keep training semantics explicit
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

    def forward(self, x):
        return self.encoder(x).pow(2).mean()


class _TightLoop(nn.Module):
    def forward(self, y):
        for _ in range(TIGHT_LOOP_OPS):
            y = y + 1
        return y


def _mlp_workload(foreach_adam=False):
    """The demo MLP's training step with SGD, or with Adam's foreach ops (the optimizer a
    CUDA step runs by default: in-place ops over lists of tensors that return nothing)."""
    model = torch_mnist.Classifier(fix=True)
    if foreach_adam:
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=True)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, labels = torch_mnist.synthetic_batch(torch.Generator().manual_seed(0))

    def step():
        optimizer.zero_grad()
        model(x, labels).backward()
        optimizer.step()

    return model, step


def _transformer_workload(compiled=False):
    """The encoder's training step with Adam; ``compiled``: its module compiled in place
    (compilation happens at the first step)."""
    torch.manual_seed(0)
    model = Encoder()
    if compiled:
        # in place: a torch.compile(model) wrapper would fire the capture's global hooks twice
        model.compile()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    x = torch.randn(16, 128, 256)

    def step():
        optimizer.zero_grad()
        model(x).backward()
        optimizer.step()

    return model, step


def _compiled_transformer_workload():
    """The compiled encoder, compiled by one untimed step.

    Raises:
      CompileFailed: that step failed; its message is the error's first line.
    """
    model, step = _transformer_workload(compiled=True)
    try:
        step()  # compiles, untimed
    except Exception as e:  # inductor's failures have no common base class
        raise CompileFailed("%s: %s" % (type(e).__name__, str(e).strip().split("\n")[0][:200]))
    return model, step


def _tight_loop_workload():
    model = _TightLoop()
    x = torch.zeros(10, requires_grad=True)
    return model, lambda: model(x)


# name: (factory, kind); the kind selects the configurations and the table
WORKLOADS = {
    "MLP (demo)": (_mlp_workload, "step"),
    "MLP (foreach Adam)": (functools.partial(_mlp_workload, foreach_adam=True), "step"),
    "Transformer encoder": (_transformer_workload, "step"),
    "Tight loop": (_tight_loop_workload, "per_op"),
    "Transformer encoder (compiled)": (_compiled_transformer_workload, "compiled"),
}
