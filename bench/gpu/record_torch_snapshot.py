"""Records a PyTorch memory snapshot on a GPU with PyTorch's own allocator: memory history on,
a few training steps of a small transformer-shaped model, then `_dump_snapshot`. The pickle is
what `remat-report import` and `remat-report whatif` read from a job that never loaded this
project's allocator; small enough (a few steps) to keep as a CPU test fixture.

usage: record_torch_snapshot.py OUT.pickle [--steps N]
"""
import argparse

import torch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("record_torch_snapshot.py: no CUDA device; this records PyTorch's GPU allocator")
    torch.manual_seed(0)
    device = torch.device("cuda")
    layer = torch.nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=1024, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, num_layers=2).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    for step in range(args.steps):
        tokens = 128 * (step + 1)  # sequence lengths that change between steps
        x = torch.randn(4, tokens, 256, device=device)
        loss = model(x).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.memory._dump_snapshot(args.out)
    torch.cuda.memory._record_memory_history(enabled=None)
    print(f"wrote {args.out}: {args.steps} steps, peak reserved {torch.cuda.max_memory_reserved()} bytes, "
          f"peak allocated {torch.cuda.max_memory_allocated()} bytes")


if __name__ == "__main__":
    main()
