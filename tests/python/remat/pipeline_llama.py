"""A tiny random Llama (transformers' decoder layers, no download) split into pipeline stages, for
the prediction tests: stage 0 holds the embedding, the last stage the norm, the head and the loss.
`split` gives the decoder layers per stage (uneven splits included); `checkpoint` runs each layer
under remat.checkpoint."""

import torch
import torch.nn as nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding

import remat

VOCAB, HIDDEN, SEQ, MICROBATCH = 128, 64, 32, 2


def config():
    c = LlamaConfig(hidden_size=HIDDEN, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
                    vocab_size=VOCAB, intermediate_size=128, max_position_embeddings=SEQ, use_cache=False)
    c._attn_implementation = "sdpa"
    return c


class LlamaStage(nn.Module):
    def __init__(self, index, num_stages, layers, checkpoint, seed):
        super().__init__()
        torch.manual_seed(seed)
        c = config()
        self.first, self.last, self.checkpoint = index == 0, index == num_stages - 1, checkpoint
        self.embed = nn.Embedding(VOCAB, HIDDEN) if self.first else None
        self.layers = nn.ModuleList(LlamaDecoderLayer(c, i) for i in range(layers))
        self.rotary = LlamaRotaryEmbedding(c)
        self.norm = LlamaRMSNorm(HIDDEN) if self.last else None
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False) if self.last else None

    def forward(self, x):
        h = self.embed(x) if self.first else x
        positions = torch.arange(h.shape[1]).unsqueeze(0)
        cos, sin = self.rotary(h, positions)
        for layer in self.layers:
            if self.checkpoint:
                h = remat.checkpoint()(lambda t, layer=layer: layer(t, position_embeddings=(cos, sin)))(h)
            else:
                h = layer(h, position_embeddings=(cos, sin))
        return self.head(self.norm(h)) if self.last else h


def loss_fn(logits, target):
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1))


def stage_module(index, num_stages, split, checkpoint):
    return LlamaStage(index, num_stages, split[index], checkpoint, seed=100 + index)


def example_microbatch(index):
    """One microbatch's input to stage `index` and its target."""
    ids = torch.randint(0, VOCAB, (MICROBATCH, SEQ), generator=torch.Generator().manual_seed(3))
    x = ids if index == 0 else torch.randn(MICROBATCH, SEQ, HIDDEN)
    return x, ids


def optimizer(params):
    return torch.optim.SGD(params, lr=0.01, momentum=0.9)
