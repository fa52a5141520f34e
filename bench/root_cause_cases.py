"""Cases of the root-cause bench: healthy training runs and injected faults with known truth.

Each :class:`Case` trains a model of ``root_cause_models`` (or a small one of
its own) 1-3 steps, healthy or with one injected fault. The ground truth of a
fault (:class:`Truth`) is derived from what was injected, never from a tool:

- op: the aten op that makes the bad value (for a fault made in backward, the
  forward op whose backward makes it); for a value made inside ``nn.Linear``
  or ``nn.Conv2d``, the first non-view op torch runs for it (asked of torch,
  since the decomposition depends on rank, bias and version);
- module: the named module whose forward runs that op; None for code outside
  every module (a plain-function loss, the optimizer step);
- file and line: the innermost source line outside torch itself (a model file
  of transformers counts as source), found at run time by searching the code.

Each fault also says how it must show in an uninstrumented run (``manifest``),
so that the bench can refuse a case whose fault did not happen as labeled.
"""

import collections
import inspect
import math
import os

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import root_cause_models as models
from root_cause_models import train

NA = "n/a"  # an anchor that does not apply to a case

Truth = collections.namedtuple("Truth", "op module file line what")
Case = collections.namedtuple("Case", "name kind family program truth manifest")
Case.__new__.__defaults__ = (None, None, None)
Case.__doc__ = """One bench program.

Fields:
  name: unique, used by ``--cases``.
  kind: "healthy" or "fault".
  family: the model family, for the table.
  program: ``program(tool) -> facts`` (see ``models.train``); None for the
    TensorFlow cases, which run in a subprocess (``bench/root_cause_tf.py``).
  truth: ``truth() -> Truth`` for faults (lazy: it imports model code).
  manifest: how a fault shows in an uninstrumented run: "forward" (the truth
    module is the first module whose output is not finite; with no module, a
    loss is not finite) or "update" (every loss is finite, the parameters end
    non-finite: the bad values were made after the last forward).
"""


def source_line(func, text):
    """``(file basename, line)`` of the one line of ``func``'s source containing ``text``.

    Raises:
      ValueError: when ``text`` is on no line or on several.
    """
    lines, start = inspect.getsourcelines(func)
    hits = [start + i for i, line in enumerate(lines) if text in line]
    if len(hits) != 1:
        raise ValueError("%r occurs %d times in %s" % (text, len(hits), func.__qualname__))
    return os.path.basename(inspect.getsourcefile(func)), hits[0]


class _OpRecorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


def _is_view(func):
    return any(r.alias_info is not None and not r.alias_info.is_write
               for r in func._schema.returns)


def compute_op(module, *inputs):
    """Name of the first non-view aten op ``module(*inputs)`` runs (``aten.addmm.default``).

    nn.Linear and nn.Conv2d decompose differently by input rank, bias and
    torch version; asking torch keeps the ground truth honest across versions.
    """
    recorder = _OpRecorder()
    with torch.no_grad(), recorder:
        module(*inputs)
    return str(next(f for f in recorder.ops if not _is_view(f)))


def _healthy(family, amp, tool):
    torch.manual_seed(0)
    model, loss_fn, batches = models.FAMILIES[family]()
    return train(tool, model, loss_fn, batches, steps=2 if amp is None else 3, amp=amp)


def healthy_cases():
    """Every family in float32, and under autocast with an overflowing GradScaler."""
    tag = {torch.float16: "fp16", torch.bfloat16: "bf16"}[models.AMP_DTYPE]
    cases = []
    for family in models.FAMILIES:
        cases.append(Case(family, "healthy", family,
                          lambda tool, f=family: _healthy(f, None, tool)))
        cases.append(Case("%s-%s-amp" % (family, tag), "healthy", family,
                          lambda tool, f=family: _healthy(f, models.AMP_DTYPE, tool)))
    return cases


# ---- injected faults -----------------------------------------------------------------------
def plain_loss(probs, labels):
    """Cross-entropy written by hand, outside any module."""
    return -(labels * torch.log(probs)).sum()


def _plain_log(tool):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    with torch.no_grad():
        model[2].weight.mul_(1e3)  # saturates the softmax: probabilities of exactly 0
    x = torch.randn(16, 8) * 10
    labels = nn.functional.one_hot(torch.randint(0, 4, (16,)), 4).float()
    return train(tool, model, lambda m, b: plain_loss(torch.softmax(m(b[0]), dim=-1), b[1]),
                 [(x, labels)], opt=torch.optim.SGD(model.parameters(), lr=0.1), steps=1)


def _plain_log_truth():
    return Truth("aten.log.default", None, *source_line(plain_loss, "torch.log("),
                 "log(0) of a saturated softmax in a plain-function loss")


T5_WO = "encoder.block.1.layer.1.DenseReluDense.wo"


def _t5_fp16(tool):
    torch.manual_seed(0)
    model, loss_fn, batches = models.t5()
    model = model.to(torch.float16)
    weight = model.get_submodule(T5_WO).weight
    with torch.no_grad():  # as large as float16 holds: products overflow, dropout's inf*0 is NaN
        weight.mul_(6e4 / float(weight.abs().max()))
    return train(tool, model, loss_fn, batches[:1], steps=1,
                 opt=torch.optim.SGD(model.parameters(), lr=1e-3))


def _t5_fp16_truth():
    from transformers.models.t5 import modeling_t5

    wo = models.t5()[0].to(torch.float16).get_submodule(T5_WO)
    return Truth(compute_op(wo, torch.ones(1, 7, wo.in_features, dtype=torch.float16)), T5_WO,
                 *source_line(modeling_t5.T5DenseActDense.forward, "self.wo(hidden_states)"),
                 "float16 overflow in T5's %s (weights scaled to |max| 6e4)" % T5_WO)


def _llama_rsqrt(tool):
    torch.manual_seed(0)
    model, loss_fn, batches = models.llama(eps=0.0)
    with torch.no_grad():
        model.model.embed_tokens.weight[int(batches[0][0, 3])] = 0
    return train(tool, model, loss_fn, batches[:1], steps=1)


def _llama_rsqrt_truth():
    from transformers.models.llama import modeling_llama

    return Truth("aten.rsqrt.default", "model.layers.0.input_layernorm",
                 *source_line(modeling_llama.LlamaRMSNorm.forward, "torch.rsqrt("),
                 "RMSNorm rsqrt(0): rms_norm_eps=0 and an all-zero embedding row")


class MaskedMeanPool(nn.Module):
    """Mean over the unmasked positions of each sequence."""

    def forward(self, x, mask):
        summed = (x * mask.unsqueeze(-1)).sum(1)
        return summed / mask.sum(1, keepdim=True)


class SentenceClassifier(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.embed = nn.Embedding(models.VOCAB, d)
        layer = nn.TransformerEncoderLayer(d, 4, dim_feedforward=64, dropout=0.0,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.pool = MaskedMeanPool()
        self.head = nn.Linear(d, 2)

    def forward(self, ids, mask):
        return self.head(self.pool(self.encoder(self.embed(ids)), mask))


def _div_zero(tool):
    torch.manual_seed(0)
    model = SentenceClassifier()
    ids = models.token_batch(0, n=3)
    mask = torch.ones(3, 8)
    mask[1] = 0  # an empty sentence: every position is padding
    return train(tool, model, lambda m, b: nn.functional.cross_entropy(m(b[0], b[1]), b[2]),
                 [(ids, mask, torch.tensor([0, 1, 0]))], steps=1)


def _div_zero_truth():
    return Truth("aten.div.Tensor", "pool", *source_line(MaskedMeanPool.forward, "/ mask.sum("),
                 "0/0 in a masked mean over a fully padded sequence")


class PairDistance(nn.Module):
    def forward(self, a, b):
        return torch.sqrt(((a - b) ** 2).sum(-1))


class Siamese(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
        self.distance = PairDistance()

    def forward(self, a, b):
        return self.distance(self.encoder(a), self.encoder(b))


def _contrastive(model, batch):
    a, b, same = batch
    d = model(a, b)
    return (same * d + (1 - same) * torch.relu(1.0 - d)).mean()


def _sqrt_backward(tool):
    torch.manual_seed(0)
    model = Siamese()
    a, b = torch.randn(4, 8), torch.randn(4, 8)
    b[0] = a[0]  # a duplicated sample: distance 0, whose sqrt has an infinite gradient
    same = torch.tensor([1.0, 1.0, 0.0, 0.0])
    return train(tool, model, _contrastive, [(a, b, same)], steps=1,
                 opt=torch.optim.SGD(model.parameters(), lr=0.1))


def _sqrt_backward_truth():
    return Truth("aten.sqrt.default", "distance", *source_line(PairDistance.forward, "torch.sqrt("),
                 "backward of sqrt(0) (infinite gradient) in a pair distance")


BERT_DENSE = "bert.encoder.layer.1.intermediate.dense"


def _nan_weight(tool):
    torch.manual_seed(0)
    model, loss_fn, batches = models.bert_mlm()
    with torch.no_grad():
        model.get_submodule(BERT_DENSE).weight[3, 5] = float("nan")
    return train(tool, model, loss_fn, batches[:1], steps=1)


def _nan_weight_truth():
    from transformers.models.bert import modeling_bert

    dense = models.bert_mlm()[0].get_submodule(BERT_DENSE)
    return Truth(compute_op(dense, torch.ones(1, 7, dense.in_features)), BERT_DENSE,
                 *source_line(modeling_bert.BertIntermediate.forward, "self.dense(hidden_states)"),
                 "one NaN in the weight of BERT's %s" % BERT_DENSE)


def _nan_input(tool):
    torch.manual_seed(0)
    model, loss_fn, batches = models.cnn()
    batches[1][0][2, 1, 5, 7] = float("nan")  # as loaded: the data, not an op, holds the NaN
    return train(tool, model, loss_fn, batches, steps=2,
                 opt=torch.optim.SGD(model.parameters(), lr=0.01))


def _nan_input_truth():
    return Truth(compute_op(models.SmallCNN().conv1, models.cnn()[2][0][0]), "conv1",
                 *source_line(models.SmallCNN.forward, "self.conv1(x)"),
                 "a NaN pixel in the second batch; the first op that reads it is the truth")


def _summed_next_token_loss(model, ids):
    logits = model(input_ids=ids[:, :-1]).logits
    return nn.functional.cross_entropy(logits.reshape(-1, models.VOCAB), ids[:, 1:].reshape(-1),
                                       reduction="sum")


def _lr_blowup(tool):
    torch.manual_seed(0)
    model, _, batches = models.gpt2()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, foreach=False)
    # step 1 runs at lr 3e38: SGD's update lr * grad overflows float32 wherever |grad| > 1.2
    scheduler = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[1], gamma=3e40)
    return train(tool, model, _summed_next_token_loss, batches, opt=opt, steps=2,
                 scheduler=scheduler)


def _lr_blowup_truth():
    return Truth("aten.add_.Tensor", None, *source_line(train, "opt.step()"),
                 "learning rate blown up to 3e38 at step 1: SGD's update overflows")


def _tf_mnist_truth():
    from tb_numerics_plugin.demo import tf_mnist  # imports tensorflow only inside run()

    # _build holds the demo's model and its tf.function loss (private, read only here)
    return Truth("Log", NA, *source_line(tf_mnist._build, "tf.math.log(probs)"),
                 "TF MNIST demo: log(0) of a saturated softmax in its tf.function loss")


# TF case name -> whether the demo runs with its fix (clipped probabilities)
TF_CASES = {"tf-mnist-fixed": True, "tf-mnist-log": False}


def fault_cases():
    """The injected faults."""
    return [
        Case("plain-fn-log", "fault", "MLP", _plain_log, _plain_log_truth, "forward"),
        Case("t5-fp16-overflow", "fault", "t5", _t5_fp16, _t5_fp16_truth, "forward"),
        Case("llama-rmsnorm-rsqrt", "fault", "llama", _llama_rsqrt, _llama_rsqrt_truth,
             "forward"),
        Case("masked-mean-div0", "fault", "nn.TransformerEncoder", _div_zero, _div_zero_truth,
             "forward"),
        Case("sqrt-backward", "fault", "siamese MLP", _sqrt_backward, _sqrt_backward_truth,
             "update"),
        Case("bert-nan-weight", "fault", "bert-mlm", _nan_weight, _nan_weight_truth, "forward"),
        Case("cnn-nan-input", "fault", "cnn", _nan_input, _nan_input_truth, "forward"),
        Case("lr-blowup", "fault", "gpt2", _lr_blowup, _lr_blowup_truth,
             "update"),
        Case("tf-mnist-log", "fault", "TF MLP", None, _tf_mnist_truth, "forward"),
    ]


def all_cases():
    """Healthy cases first, then faults."""
    return healthy_cases() + [Case("tf-mnist-fixed", "healthy", "TF MLP")] + fault_cases()


def mismatch(case, truth, facts):
    """Why an uninstrumented run does not behave as ``case`` is labeled; None when it does.

    Args:
      facts: the program's facts plus ``bad_modules`` (module names in the order
        their outputs first held inf or NaN); ``params_finite`` None = not known.
    """
    losses_finite = all(math.isfinite(v) for v in facts["losses"])
    params_finite = facts.get("params_finite")
    if case.kind == "healthy":
        if not losses_finite or params_finite is False:
            return "a healthy run went non-finite (losses %s)" % facts["losses"]
        if facts.get("scale") is not None and facts["scale"] >= 2.0 ** 40:
            return "no step overflowed: the GradScaler never backed off"
        return None
    if case.manifest == "update":
        if not losses_finite or params_finite is not False:
            return "expected finite losses and non-finite parameters"
        return None
    bad = facts.get("bad_modules", [])
    if truth.module in (None, NA):
        if losses_finite or bad:
            return "expected a non-finite loss and no module output non-finite (got %s)" % bad
    elif bad[:1] != [truth.module]:
        return "first module with a non-finite output: %s, not %s" % (bad[:1], truth.module)
    return None
