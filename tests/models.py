"""Real model code trained a few steps on CPU under the capture, healthy or with a fault.

Each program builds a tiny random-init model (``nn.Transformer`` layers,
transformers GPT-2, T5, Llama, ...), trains it for a few steps inside
``tbn.enable_dump_debug_info`` and returns what it knows of the ground truth.
Used by the tests (small, CPU) and by ``bench/root_cause.py``.
"""

import contextlib

import torch
from torch import nn

from tb_numerics_plugin import torch as tbn

VOCAB = 64


def _batch(n=2, seq=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (n, seq), generator=g)


@contextlib.contextmanager
def _capture(dump, mode="FULL_HEALTH"):
    handle = tbn.enable_dump_debug_info(dump, tensor_debug_mode=mode, circular_buffer_size=-1)
    try:
        yield handle
    finally:
        handle.close()


class CausalEncoder(nn.Module):
    """``nn.TransformerEncoder`` language model; the causal mask comes from the caller."""

    def __init__(self, d=32, heads=4, layers=2):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, d)
        layer = nn.TransformerEncoderLayer(d, heads, dim_feedforward=64, dropout=0.0,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, VOCAB)

    def forward(self, ids, mask):
        return self.head(self.encoder(self.embed(ids), mask=mask, is_causal=True))


def transformer_encoder(dump, steps=2, mode="FULL_HEALTH"):
    """Healthy: ``nn.TransformerEncoder`` with ``generate_square_subsequent_mask`` (its -inf)."""
    torch.manual_seed(0)
    model = CausalEncoder()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ids = _batch()
    with _capture(dump, mode):
        for _ in range(steps):
            mask = nn.Transformer.generate_square_subsequent_mask(ids.shape[1])
            logits = model(ids[:, :-1], mask[:-1, :-1])
            loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
    return {"loss": float(loss)}


def _hf_train(dump, model, steps, mode, seq2seq=False, opt=None, batch=None):
    opt = opt or torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = _batch() if batch is None else batch
    with _capture(dump, mode):
        for _ in range(steps):
            if seq2seq:
                out = model(input_ids=ids, labels=ids)
            else:
                out = model(input_ids=ids, labels=ids)
            opt.zero_grad()
            out.loss.backward()
            opt.step()
    return {"loss": float(out.loss)}


def gpt2(dump, steps=2, mode="FULL_HEALTH"):
    """Healthy: transformers GPT-2, random init."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                     attn_implementation="eager")
    return _hf_train(dump, GPT2LMHeadModel(cfg), steps, mode)


def _t5(dtype=torch.float32):
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    cfg = T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                   num_decoder_layers=2, num_heads=4, decoder_start_token_id=0,
                   attn_implementation="eager")
    return T5ForConditionalGeneration(cfg).to(dtype)


def t5(dump, steps=2, mode="FULL_HEALTH"):
    """Healthy: transformers T5 (its relative-position bucket takes ``log(0)``)."""
    return _hf_train(dump, _t5(), steps, mode, seq2seq=True)


def t5_compiled(dump, steps=2, mode="FULL_HEALTH"):
    """Healthy: ``t5`` with the model compiled (its masked log(0) inside the compiled graph)."""
    return _hf_train(dump, torch.compile(_t5()), steps, mode, seq2seq=True)


def t5_fp16_overflow(dump, steps=1, mode="FULL_HEALTH"):
    """Fault: T5 in float16 whose ``encoder.block.1.layer.1.DenseReluDense.wo`` overflows."""
    model = _t5(torch.float16)
    wo = model.encoder.block[1].layer[1].DenseReluDense.wo.weight
    with torch.no_grad():  # as large as float16 holds: its products overflow
        wo.mul_(6e4 / float(wo.abs().max()))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    _hf_train(dump, model, steps, mode, seq2seq=True, opt=opt)
    return {"module": "encoder.block.1.layer.1.DenseReluDense.wo", "file": "modeling_t5.py"}


def llama_rsqrt(dump, steps=1, mode="FULL_HEALTH", compiled=False):
    """Fault: Llama with ``rms_norm_eps=0`` and a zero embedding row: ``rsqrt(0)``;
    ``compiled``: the model wrapped by ``torch.compile`` (inductor)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=32, rms_norm_eps=0.0,
                      attn_implementation="eager")
    model = LlamaForCausalLM(cfg)
    ids = _batch()
    with torch.no_grad():
        model.model.embed_tokens.weight[int(ids[0, 3])] = 0
    _hf_train(dump, torch.compile(model) if compiled else model, steps, mode, batch=ids)
    return {"module": "model.layers.0.input_layernorm", "op": "rsqrt",
            "file": "modeling_llama.py"}


def llama_rsqrt_compiled(dump, steps=1, mode="FULL_HEALTH"):
    """``llama_rsqrt`` with the model compiled: its forward runs compiled under the capture."""
    return llama_rsqrt(dump, steps, mode, compiled=True)


def plain_loss(probs, labels):
    """A loss written as a plain function, outside any module."""
    return -(labels * torch.log(probs)).sum()


def plain_function_loss(dump, steps=1, mode="FULL_HEALTH"):
    """Fault: ``torch.log`` of a saturated softmax in a plain-function loss."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    with torch.no_grad():
        model[2].weight.mul_(1e3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(16, 8) * 10
    labels = nn.functional.one_hot(torch.randint(0, 4, (16,)), 4).float()
    with _capture(dump, mode):
        for _ in range(steps):
            probs = torch.softmax(model(x), dim=-1)
            loss = plain_loss(probs, labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return {"op": "aten.log.default", "func": "plain_loss"}


def amp_grad_scaler(dump, steps=3, mode="FULL_HEALTH"):
    """Healthy: float16 autocast + ``GradScaler`` whose first steps overflow and are skipped."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 40)
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    with _capture(dump, mode):
        for _ in range(steps):
            with torch.autocast("cpu", dtype=torch.float16):
                loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    params_finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
    return {"loss": float(loss), "params_finite": params_finite, "scale": scaler.get_scale()}
