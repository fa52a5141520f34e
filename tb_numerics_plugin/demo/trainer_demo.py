"""A transformers ``Trainer`` run whose loss goes to +inf at one step, stopped there.

A tiny GPT-2 (random init, CPU) learns to copy token sequences with a
hand-written cross-entropy: ``torch.log(torch.softmax(logits / temperature))``.
A temperature schedule with a bug sets the temperature to 1e-4 at step
``--blowup_step``: the scaled logits saturate the softmax, probabilities
underflow to 0, and ``torch.log`` gives -inf, so the loss is +inf. The
``NumericsCallback`` dumps every step, marks steps, and stops the run at that
step with ``NonFiniteError`` after printing the first bad tensor. ``--fix``
takes ``log_softmax`` instead, which stays finite.

Usage::

    python -m tb_numerics_plugin.demo.trainer_demo --dump_dir /tmp/dump \
        [--steps 6] [--blowup_step 3] [--fix] [--trace_steps 20-24]
    tb-numerics report /tmp/dump

Exit status 1 when the run was stopped at a non-finite value, else 0.
"""

import argparse
import sys

import torch
import transformers
from transformers.modeling_outputs import CausalLMOutput

from tb_numerics_plugin.integrations.transformers import NonFiniteError, NumericsCallback

VOCAB = 64
SEQUENCE = 16
BAD_TEMPERATURE = 1e-4


class ToyLM(transformers.GPT2LMHeadModel):
    """GPT-2 with a hand-written next-token cross-entropy at a temperature."""

    def __init__(self, config, fix=False):
        super().__init__(config)
        self.temperature = 1.0
        self.fix = fix

    def forward(self, input_ids, labels=None, **kwargs):
        logits = super().forward(input_ids=input_ids, **kwargs).logits
        loss = None
        if labels is not None:
            scaled = logits[:, :-1] / self.temperature
            if self.fix:
                log_probs = torch.log_softmax(scaled, dim=-1)
            else:
                probs = torch.softmax(scaled, dim=-1)
                log_probs = torch.log(probs)  # the bad line: log(0) = -inf
            loss = -log_probs.gather(-1, labels[:, 1:, None]).mean()
        return CausalLMOutput(loss=loss, logits=logits)


class TemperatureSchedule(transformers.TrainerCallback):
    """The bug: sets the model's temperature to 1e-4 at step ``blowup_step``."""

    def __init__(self, blowup_step):
        self.blowup_step = blowup_step

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        if self.blowup_step is not None and state.global_step == self.blowup_step:
            model.temperature = BAD_TEMPERATURE


class CopyTask(torch.utils.data.Dataset):
    """Random token sequences whose labels are the sequences themselves."""

    def __init__(self, size=64, seed=0):
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, VOCAB, (size, SEQUENCE), generator=generator)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def make_trainer(output_dir, callbacks, steps=6, fix=False, blowup_step=3, torch_compile=False):
    """A Trainer of a 2-layer, 32-wide ToyLM on CPU with ``callbacks`` plus the
    temperature bug at ``blowup_step`` (None: no bug); ``torch_compile``: the
    Trainer compiles the model (``TrainingArguments.torch_compile``)."""
    transformers.set_seed(0)
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=SEQUENCE, n_embd=32,
                                     n_layer=2, n_head=2)
    args = transformers.TrainingArguments(
        output_dir=output_dir, max_steps=steps, per_device_train_batch_size=4,
        learning_rate=1e-3, report_to=[], use_cpu=True, save_strategy="no",
        logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0, seed=0,
        torch_compile=torch_compile)
    return transformers.Trainer(
        model=ToyLM(config, fix=fix), args=args, train_dataset=CopyTask(),
        callbacks=[TemperatureSchedule(blowup_step)] + list(callbacks))


def run(dump_dir, steps=6, fix=False, blowup_step=3, output_dir=None, torch_compile=False,
        **callback_kwargs):
    """Trains under ``NumericsCallback(dump_dir, **callback_kwargs)`` (``torch_compile``:
    the model compiled, see :func:`make_trainer`).

    Returns:
      (trainer, the NonFiniteError that stopped it or None).
    """
    callback = NumericsCallback(dump_dir, **callback_kwargs)
    trainer = make_trainer(output_dir or dump_dir + ".trainer", [callback], steps, fix,
                           blowup_step, torch_compile)
    try:
        trainer.train()
    except NonFiniteError as e:
        callback.close()
        return trainer, e
    return trainer, None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dump_dir", required=True)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--blowup_step", type=int, default=3)
    parser.add_argument("--fix", action="store_true")
    parser.add_argument("--trace_steps", default=None,
                        help='steps whose ops are traced, e.g. "20-24" (default: every step; '
                             "the numerics series covers every step either way)")
    args = parser.parse_args(argv)
    trainer, error = run(args.dump_dir, args.steps, args.fix, args.blowup_step,
                         trace_steps=args.trace_steps)
    if error is not None:
        print("training stopped at step %s: %s" % (error.step, error))
        return 1
    print("trained %d steps, no inf or NaN" % trainer.state.global_step)
    return 0


if __name__ == "__main__":
    sys.exit(main())
