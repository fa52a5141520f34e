"""A small torch training program for the writer's fault tests (run as a subprocess).

It trains a two-layer net with SGD under ``enable_dump_debug_info``. At step
``--nan-step`` the logits (which training pushes up) are scaled by -1e4, so
``torch.log(probs)`` (the line marked ``THE BAD LINE``) takes the log of
sigmoids that underflowed to 0: -inf, then NaN gradients. After ``--steps``
steps it may run one eager op outside any module (``--eager-nan``:
``torch.log`` of a zero, an execution still open when the program stalls),
then stalls in ``time.sleep`` (or, with ``--exit``, disables and exits).

Lines printed (flushed at once), for the test to follow:
  ``step <i> <json>``    after each step; json = the writer's accepted counts
  ``stall <json>``       before stalling
  ``stalled <json>``     after ``--stall-report-s`` seconds of stalling
  ``done <json>``        at the end (``--exit``): losses and the final status

Usage: python writer_kill_program.py DUMP_DIR [options]
"""

import argparse
import json
import math
import time

import torch
from torch import nn

from tb_numerics_plugin import torch as tbn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x, temperature):
        logits = self.fc2(torch.relu(self.fc1(x))) * temperature
        probs = torch.sigmoid(logits)
        return -torch.log(probs).mean()  # THE BAD LINE: log(0) = -inf at the NaN step


def train(steps, nan_step, report=None):
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = []
    for step in range(steps):
        x = torch.randn(8, 16, generator=generator)
        loss = model(x, -1e4 if step == nan_step else 1.0)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        if report is not None:
            report("step %d" % step)
    return losses


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("dump_dir")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--nan-step", type=int, default=10)
    parser.add_argument("--mode", default="FULL_HEALTH")
    parser.add_argument("--buffer", type=int, default=-1)
    parser.add_argument("--flush-interval", type=float, default=2.0)
    parser.add_argument("--eager-nan", action="store_true")
    parser.add_argument("--flush-after-first-step", action="store_true")
    parser.add_argument("--stall-report-s", type=float, default=0.0)
    parser.add_argument("--start-at", type=float, default=0.0,
                        help="wall time to wait for before enabling (same-second starts)")
    parser.add_argument("--exit", action="store_true", help="no stall: disable and exit")
    args = parser.parse_args()

    expected = train(args.steps, args.nan_step)  # the same program without capture
    if args.start_at:
        time.sleep(max(0.0, args.start_at - time.time()))
    handle = tbn.enable_dump_debug_info(args.dump_dir, args.mode,
                                        circular_buffer_size=args.buffer,
                                        flush_interval_s=args.flush_interval)
    writer = handle._session.writer

    def report(word):
        if word == "step 0" and args.flush_after_first_step:
            handle.flush()
        print(word, json.dumps(writer.status()), flush=True)

    losses = train(args.steps, args.nan_step, report)
    same = all(a == b or (math.isnan(a) and math.isnan(b)) for a, b in zip(losses, expected))
    if args.eager_nan:
        torch.log(torch.zeros(3))  # an eager op outside any module: -inf, left open
    if args.exit:
        tbn.disable_dump_debug_info()
        print("done", json.dumps({"same_losses": same, "losses": [repr(v) for v in losses],
                                  "status": writer.status(), "prefix": writer.prefix}),
              flush=True)
        return 0 if same else 3
    report("stall")
    if args.stall_report_s:
        time.sleep(args.stall_report_s)
        report("stalled")
    time.sleep(3600)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
