"""A GPT-style decoder-only transformer language model in plain PyTorch.

Pre-LayerNorm blocks (x + attn(ln(x)), x + mlp(ln(x))), learnt position
embeddings, a final LayerNorm, and the output layer tied to the token
embedding (the logits are x @ embedding^T, so the embedding is one tensor
of the state_dict, sent once per commit). Initialised as GPT-2: normal
(0, 0.02), the residual projections scaled by 1/sqrt(2 x layers).

Every floating-point tensor of state_dict() is a trained parameter; the
causal mask is a non-persistent bool buffer, so the site serves exactly
the parameters.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Config:
    vocab_size: int = 1024
    context: int = 128
    width: int = 128
    layers: int = 4
    heads: int = 4

    @classmethod
    def parse(cls, text: str) -> "Config":
        """"width=256,layers=6" -> Config with those fields changed."""
        fields = {}
        for item in filter(None, text.split(",")):
            key, _, value = item.partition("=")
            if key not in cls.__dataclass_fields__:
                raise ValueError("unknown model field %r (fields: %s)" %
                                 (key, ", ".join(cls.__dataclass_fields__)))
            fields[key] = int(value)
        return cls(**fields)


class Attention(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        if config.width % config.heads:
            raise ValueError("width %d is not a multiple of heads %d" %
                             (config.width, config.heads))
        self.heads = config.heads
        self.qkv = nn.Linear(config.width, 3 * config.width)
        self.proj = nn.Linear(config.width, config.width)
        mask = torch.ones(config.context, config.context).tril().bool()
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x):
        batch, length, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        # [batch, heads, length, width / heads]
        q, k, v = (t.view(batch, length, self.heads, -1).transpose(1, 2)
                   for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
        scores = scores.masked_fill(~self.mask[:length, :length], -math.inf)
        y = F.softmax(scores, dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(batch, length, width))


class Block(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.ln1 = nn.LayerNorm(config.width)
        self.attn = Attention(config)
        self.ln2 = nn.LayerNorm(config.width)
        self.fc = nn.Linear(config.width, 4 * config.width)
        self.proj = nn.Linear(4 * config.width, config.width)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.proj(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, config: Config = Config()):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.width)
        self.position = nn.Embedding(config.context, config.width)
        self.blocks = nn.ModuleList(Block(config)
                                    for _ in range(config.layers))
        self.ln = nn.LayerNorm(config.width)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() > 1:  # LayerNorm weights stay 1
                std = 0.02 / math.sqrt(2 * config.layers) \
                    if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, tokens):  # [batch, length] -> logits [batch, length, vocab]
        positions = torch.arange(tokens.size(1), device=tokens.device)
        x = self.embed(tokens) + self.position(positions)
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln(x), self.embed.weight)

    def loss(self, windows):  # [batch, length + 1] -> mean next-token NLL
        logits = self(windows[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)),
                               windows[:, 1:].reshape(-1))


def optimizer(model: nn.Module, lr: float = 1e-3, weight_decay: float = 0.1):
    """AdamW as nanoGPT sets it up: weight decay on the matrices and the
    embeddings, none on biases and LayerNorm weights; betas (0.9, 0.95)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": rest, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95))
