"""A small pre-norm transformer block (attention, MLP with optional dropout) and gradient
helpers, shared by the parity and state-hook tests (tests/remat/transformer_block.hpp in
Python)."""

import math

import torch
import torch.nn.functional as F

D = 16


class Block:
    def __init__(self, device="cpu"):
        # The same values on every device: drawn on the CPU from seed 1, then moved.
        torch.manual_seed(1)

        def p(shape, scale):
            return (torch.randn(shape) * scale).to(device).requires_grad_(True)

        self.ln1_w, self.ln1_b = p((D,), 1.0), p((D,), 0.1)
        self.wq, self.wk, self.wv, self.wo = (p((D, D), 0.25) for _ in range(4))
        self.ln2_w, self.ln2_b = p((D,), 1.0), p((D,), 0.1)
        self.w1, self.w2 = p((4 * D, D), 0.25), p((D, 4 * D), 0.25)

    def parameters(self):
        return [self.ln1_w, self.ln1_b, self.wq, self.wk, self.wv, self.wo, self.ln2_w, self.ln2_b, self.w1, self.w2]

    def attention(self, x):
        h = F.layer_norm(x, (D,), self.ln1_w, self.ln1_b)
        q, k, v = F.linear(h, self.wq), F.linear(h, self.wk), F.linear(h, self.wv)
        scores = torch.softmax(torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(D), -1)
        return x + F.linear(torch.matmul(scores, v), self.wo)

    def mlp(self, y, dropout=0.0):
        m = F.layer_norm(y, (D,), self.ln2_w, self.ln2_b)
        hidden = F.gelu(F.linear(m, self.w1))
        if dropout > 0:
            hidden = F.dropout(hidden, dropout, training=True)
        return y + F.linear(hidden, self.w2)

    def forward(self, x, dropout=0.0):
        return self.mlp(self.attention(x), dropout)


def gradients(block, x):
    """Gradients of the parameters, then of x; clears them for the next run."""
    out = [p.grad.clone() for p in block.parameters()] + [x.grad.clone()]
    for t in block.parameters() + [x]:
        t.grad = None
    return out


def assert_bitwise_equal(actual, expected):
    assert len(actual) == len(expected)
    for i, (a, b) in enumerate(zip(actual, expected)):
        assert torch.equal(a, b), f"gradient {i} differs: max abs difference {(a - b).abs().max().item()}"
