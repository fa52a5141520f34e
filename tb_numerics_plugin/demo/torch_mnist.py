"""A PyTorch MLP whose loss goes to -inf and then NaN, dumped with tb-numerics.

The torch twin of ``tf_mnist``: a 784-500-10 MLP trained on synthetic data
(fixed seed) whose weights start so large that the softmax saturates. The
hand-written cross-entropy takes ``torch.log(probs)``: probabilities that
underflowed to 0 give -inf, and ``labels * -inf`` gives NaN. ``--fix`` clamps
the probabilities first. Model and loss run inside one root module, so the
log op and the softmax that feeds it share one captured graph.

Usage::

    python -m tb_numerics_plugin.demo.torch_mnist --dump_dir /tmp/dump \
        --dump_tensor_debug_mode FULL_HEALTH [--fix] [--steps 3]
"""

import argparse
import sys

import torch
from torch import nn

from tb_numerics_plugin import torch as tbn

_BATCH = 100
_HIDDEN = 500
_CLASSES = 10
_FEATURES = 784


class MLP(nn.Module):
    """784-500-10 with ReLU, initialised wide enough to saturate the softmax."""

    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(_FEATURES, _HIDDEN)
        self.logits = nn.Linear(_HIDDEN, _CLASSES)
        for layer in (self.hidden, self.logits):
            nn.init.normal_(layer.weight, std=1.0)
            nn.init.zeros_(layer.bias)

    def forward(self, x):
        return self.logits(torch.relu(self.hidden(x)))


class Classifier(nn.Module):
    """The MLP plus a hand-written cross-entropy (the root module of each step)."""

    def __init__(self, fix=False):
        super().__init__()
        self.mlp = MLP()
        self.fix = fix

    def forward(self, x, labels):
        probs = torch.softmax(self.mlp(x), dim=1)
        if self.fix:
            probs = torch.clamp(probs, 1e-6, 1.0)
        log_probs = torch.log(probs)  # the bad line: log(0) = -inf
        return -(labels * log_probs).sum(dim=1).mean()


def synthetic_batch(generator):
    """Returns (x, one-hot labels) drawn from ``generator``."""
    x = torch.randn(_BATCH, _FEATURES, generator=generator)
    labels = torch.randint(0, _CLASSES, (_BATCH,), generator=generator)
    return x, nn.functional.one_hot(labels, _CLASSES).float()


def train(steps, fix=False, learning_rate=0.1):
    """Runs ``steps`` SGD steps; returns the list of losses (floats)."""
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)
    model = Classifier(fix)
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate)
    losses = []
    for _ in range(steps):
        x, labels = synthetic_batch(generator)
        loss = model(x, labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def run(dump_dir=None, tensor_debug_mode="FULL_HEALTH", fix=False, steps=3,
        circular_buffer_size=-1):
    """Trains, dumping into ``dump_dir`` when given; returns the losses."""
    if not dump_dir:
        return train(steps, fix)
    with tbn.enable_dump_debug_info(dump_dir, tensor_debug_mode=tensor_debug_mode,
                                    circular_buffer_size=circular_buffer_size):
        return train(steps, fix)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dump_dir", default="")
    parser.add_argument("--dump_tensor_debug_mode", default="FULL_HEALTH",
                        choices=tbn.TENSOR_DEBUG_MODES)
    parser.add_argument("--fix", action="store_true")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    losses = run(args.dump_dir, args.dump_tensor_debug_mode, args.fix, args.steps)
    for step, loss in enumerate(losses):
        print("step %d: loss %s" % (step, loss))
    return 0


if __name__ == "__main__":
    sys.exit(main())
