"""examples/gpt/gpt_model.h's GPT in PyTorch, with the same parameter names and
GPT-2 initialisation: the model bench/fsdp_peer.py shards with PyTorch's FSDP
and bench/eager_step.py trains eagerly.

  from gpt_reference import GPT, VOCAB, BLOCK_SIZE
  model = GPT(n_layer=4, n_head=4, d=96)   # examples/gpt/gpt_fsdp.yaml's
  loss = model(tokens[:, :-1], tokens[:, 1:])

Vocabulary 96 ('\\n' and printable ASCII), context 64 characters, no dropout,
the output layer tied to the token embedding.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB = 96
BLOCK_SIZE = 64


def init_gpt2_weights(module, n_layer):
    """gpt_model.h's init_gpt2_weights: small normal weights, zero biases,
    residual projections scaled by depth; layer norms as built."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "ln" in name:
                continue
            if name.endswith("bias"):
                p.zero_()
            else:
                residual = "proj.weight" in name or "mlp.2.weight" in name
                p.normal_(0.0, 0.02 / math.sqrt(2.0 * n_layer) if residual else 0.02)


class CausalSelfAttention(nn.Module):
    def __init__(self, d, n_head):
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.q_bias = nn.Parameter(torch.zeros(d))  # no key bias, as gpt_model.h
        self.v_bias = nn.Parameter(torch.zeros(d))
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        batch, steps, channels = x.shape
        head_size = channels // self.n_head

        def heads(t):
            return t.view(batch, steps, self.n_head, head_size).transpose(1, 2)

        q, k, v = self.qkv(x).split(channels, dim=2)
        q, k, v = heads(q + self.q_bias), heads(k), heads(v + self.v_bias)
        scores = q.matmul(k.transpose(-2, -1)) / math.sqrt(head_size)
        future = torch.ones(steps, steps, dtype=torch.bool, device=x.device).triu(1)
        attention = torch.softmax(scores.masked_fill(future, float("-inf")), -1)
        return self.proj(attention.matmul(v).transpose(1, 2).contiguous().view(batch, steps, channels))


class Block(nn.Module):
    def __init__(self, d, n_head, n_layer):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, n_head)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        init_gpt2_weights(self, n_layer)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, n_layer, n_head, d):
        super().__init__()
        self.tok_emb = nn.Embedding(VOCAB, d)
        init_gpt2_weights(self.tok_emb, n_layer)
        self.pos_emb = nn.Parameter(torch.randn(1, BLOCK_SIZE, d) * 0.02)
        self.blocks = nn.ModuleList(Block(d, n_head, n_layer) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d)

    def forward(self, tokens, targets):
        x = self.tok_emb(tokens) + self.pos_emb[:, : tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        logits = self.ln_f(x).matmul(self.tok_emb.weight.t())  # tied output layer
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
