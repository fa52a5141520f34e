"""Model families of the root-cause bench and the training loop every case runs.

Tiny random-init configs of real model code, all on CPU: transformers GPT-2,
Llama, Qwen2, T5, BERT (masked LM) and ViT (``attn_implementation="eager"``),
an ``nn.TransformerEncoder`` language model with a causal (-inf) mask and a
small CNN. A builder returns ``(model, loss_fn, batches)``; :func:`train`
runs them under a *tool* (``bench/root_cause.py``: anything with
``attach(model)`` and ``session()``).
"""

import collections
import contextlib

import torch
from torch import nn

VOCAB = 64


def token_batch(seed=0, n=2, seq=8):
    """``n`` random token sequences of length ``seq``, from a fixed seed."""
    return torch.randint(0, VOCAB, (n, seq), generator=torch.Generator().manual_seed(seed))


def _finite(tensors):
    return all(bool(torch.isfinite(t).all()) for t in tensors)


def train(tool, model, loss_fn, batches, opt=None, steps=2, amp=None, scheduler=None):
    """Trains ``model`` ``steps`` steps inside ``tool.session()``; returns the run's facts.

    Args:
      tool: hooks the model (``attach``) and wraps the loop (``session``).
      loss_fn: ``loss_fn(model, batch) -> scalar loss``.
      batches: cycled through, one per step.
      opt: defaults to AdamW(lr=1e-3).
      amp: None, or the autocast dtype; then a GradScaler with init_scale 2**40
        (its first steps overflow and are skipped).
      scheduler: an LR scheduler stepped after each optimizer step.

    Returns:
      ``{"losses", "params_finite", "modules", "root", "scale"}``.
    """
    opt = opt or torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 40) if amp else None
    tool.attach(model)
    losses = []
    with tool.session():
        for step in range(steps):
            batch = batches[step % len(batches)]
            with torch.autocast("cpu", dtype=amp) if amp else contextlib.nullcontext():
                loss = loss_fn(model, batch)
            opt.zero_grad()
            if scaler is None:
                loss.backward()
                opt.step()
            else:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            if scheduler is not None:
                scheduler.step()
            losses.append(float(loss.detach()))
    return {"losses": losses, "params_finite": _finite(model.parameters()),
            "modules": [name for name, _ in model.named_modules()],
            "root": type(model).__name__, "scale": scaler.get_scale() if scaler else None}


# ---- model families ------------------------------------------------------------------------
def _lm_loss(model, ids):
    return model(input_ids=ids, labels=ids).loss


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                     attn_implementation="eager")
    return GPT2LMHeadModel(cfg), _lm_loss, [token_batch(0), token_batch(1)]


def llama(eps=1e-6):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=32, rms_norm_eps=eps,
                      attn_implementation="eager")
    return LlamaForCausalLM(cfg), _lm_loss, [token_batch(0), token_batch(1)]


def qwen2():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=32, attn_implementation="eager")
    return Qwen2ForCausalLM(cfg), _lm_loss, [token_batch(0), token_batch(1)]


def t5():
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                   num_decoder_layers=2, num_heads=4, decoder_start_token_id=0,
                   attn_implementation="eager")
    return T5ForConditionalGeneration(cfg), _lm_loss, [token_batch(0), token_batch(1)]


def _mlm_batch(seed):
    ids = token_batch(seed)
    labels = torch.full_like(ids, -100)
    labels[:, 2::3] = ids[:, 2::3]
    masked = ids.clone()
    masked[:, 2::3] = 1  # the [MASK] id of this vocabulary
    return masked, labels


def bert_mlm():
    from transformers import BertConfig, BertForMaskedLM

    cfg = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                     num_attention_heads=4, intermediate_size=64, max_position_embeddings=32,
                     attn_implementation="eager")
    return (BertForMaskedLM(cfg), lambda m, b: m(input_ids=b[0], labels=b[1]).loss,
            [_mlm_batch(0), _mlm_batch(1)])


def vit():
    from transformers import ViTConfig, ViTForImageClassification

    cfg = ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32,
                    num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                    num_labels=4, attn_implementation="eager")
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(2, 3, 16, 16, generator=g), torch.randint(0, 4, (2,), generator=g))
               for _ in range(2)]
    return (ViTForImageClassification(cfg),
            lambda m, b: m(pixel_values=b[0], labels=b[1]).loss, batches)


class CausalEncoder(nn.Module):
    """``nn.TransformerEncoder`` language model with a causal (-inf) mask."""

    def __init__(self, d=32, heads=4, layers=2):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, d)
        layer = nn.TransformerEncoderLayer(d, heads, dim_feedforward=64, dropout=0.0,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, VOCAB)

    def forward(self, ids):
        mask = nn.Transformer.generate_square_subsequent_mask(ids.shape[1])
        return self.head(self.encoder(self.embed(ids), mask=mask, is_causal=True))


def _next_token_loss(model, ids):
    logits = model(ids[:, :-1])
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1))


def causal_encoder():
    return CausalEncoder(), _next_token_loss, [token_batch(0), token_batch(1)]


class SmallCNN(nn.Module):
    """Two conv blocks and a linear classifier for 3x16x16 images."""

    def __init__(self, classes=4):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc = nn.Linear(16 * 4 * 4, classes)

    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)
        x = nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def _images(seed, n=4):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 16, 16, generator=g), torch.randint(0, 4, (n,), generator=g)


def cnn():
    return (SmallCNN(), lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1]),
            [_images(0), _images(1)])


FAMILIES = collections.OrderedDict([
    ("gpt2", gpt2), ("llama", llama), ("qwen2", qwen2), ("t5", t5), ("bert-mlm", bert_mlm),
    ("vit", vit), ("nn.TransformerEncoder", causal_encoder), ("cnn", cnn),
])
# float16 autocast runs every family on CPU with torch 2.13 (bfloat16 would be the fallback)
AMP_DTYPE = torch.float16


