"""The uses torch_remat's offloading guide describes, written against `remat` (its import line
changed): a host-copy pair around a checkpoint, the pair given to the checkpoint itself (inputs
too), a pack hook asking why it runs, and a deferred pack reading the producer's context."""

from dataclasses import dataclass

import torch

import remat  # torch_remat's guide: import torch_remat as remat


@dataclass
class HostCopy:
    tensor: torch.Tensor
    device: torch.device


def to_host(tensor):
    return HostCopy(tensor.detach().to("cpu", copy=True), tensor.device)


def from_host(saved):
    return saved.tensor.to(saved.device)


def block(x):
    h = remat.region(lambda t: torch.nn.functional.gelu(t @ t.transpose(-1, -2)), "attention", recompute=False)(x)
    return remat.region(lambda t: (t * 2.0).tanh(), "mlp")(h) + x


def plain_grad(x):
    leaf = x.detach().clone().requires_grad_(True)
    block(leaf).sum().backward()
    return leaf.grad


def test_a_host_copy_pair_around_the_checkpoint_gives_the_plain_gradient():
    x = torch.rand(2, 4, 4, requires_grad=True)
    with remat.saved_tensors_hooks(to_host, from_host):
        output = remat.checkpoint(region_name="layers.0")(block)(x)
    output.sum().backward()  # unpack runs after the with block has exited
    assert torch.equal(x.grad, plain_grad(x))


def test_the_pair_given_to_the_checkpoint_also_takes_its_inputs():
    kinds = []

    def pack(tensor):
        kinds.append(remat.current_saved_tensor_info().kind)
        return to_host(tensor)

    x = torch.rand(2, 4, 4, requires_grad=True)
    checkpointed = remat.checkpoint(region_name="layers.0", saved_tensors_hooks=(pack, from_host))(block)
    checkpointed(x).sum().backward()
    assert remat.SavedTensorKind.CHECKPOINT_INPUT in kinds and remat.SavedTensorKind.BACKWARD in kinds
    assert torch.equal(x.grad, plain_grad(x))


def test_a_deferred_pack_reads_the_bucket_that_was_current_at_the_producer():
    buckets = {}
    current_bucket = ["bucket-0"]

    def pack(tensor):
        info = remat.current_saved_tensor_info()
        buckets.setdefault(info.context, []).append(info.kind)
        return to_host(tensor)

    def body(x):
        with remat.saved_tensors_hooks(pack, from_host, capture_context=lambda: current_bucket[0]):
            y = remat.region(lambda t: t.sin() * 2.0, "producer", recompute=False)(x)
        current_bucket[0] = "bucket-1"  # changed before the output is packed at the end of forward
        return remat.region(lambda t: t.cos(), "consumer")(y)

    x = torch.rand(3, requires_grad=True)
    remat.checkpoint(region_name="deferred")(body)(x * 1.0).sum().backward()
    assert set(buckets) == {"bucket-0"}
    assert sorted(kind.name for kind in buckets["bucket-0"]) == ["BACKWARD", "SAVE_OUTPUT"]
    expected = -(x.detach().sin() * 2.0).sin() * 2.0 * x.detach().cos()
    assert torch.allclose(x.grad, expected)
