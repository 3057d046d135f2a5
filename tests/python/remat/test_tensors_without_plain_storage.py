"""Tensors the runtime cannot follow by a storage of their own: sparse (COO and CSR), nested
(strided and jagged) and __torch_dispatch__ wrapper subclasses, through checkpoints, save and
recompute regions, CpuOffload, profiles (per op too) and plans by step peak, gradients bitwise
those without checkpointing, or a clear refusal naming the tensor and the fix.

Before: a save region whose op saved a sparse matrix (torch.sparse.mm) raised "Cannot access
storage of SparseTensorImpl" in forward, and any profile of it did; a save region returning a
sparse COO tensor crashed the process in backward (recompute handed back a placeholder made as
if it were strided); one returning a CSR tensor raised "Sparse CSR tensors do not have strides";
a profile of a wrapper subclass raised "Attempted to access the data pointer on an invalid python
storage" (with ops=True, from inside an op: the process aborted); a strided nested input raised
PyTorch's "Internal error: NestedTensorImpl doesn't support sizes", and a profile of a save region
keeping a jagged one raised (the memory report asked its sizes)."""

import warnings

import pytest
import torch
from torch.utils._pytree import tree_map

import remat

pytestmark = pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta",
                                        "ignore:The PyTorch API of nested tensors is in prototype")

INDICES = torch.tensor([[0, 1, 2, 3], [1, 2, 0, 3]])
VALUES = torch.tensor([1.0, 2.0, 3.0, 4.0])


def sparse_matrix():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sparse invariant checks
        return torch.sparse_coo_tensor(INDICES, VALUES, (4, 4)) * 1.0  # made in the step


def saves_a_sparse_matrix(recompute):
    def body(x):
        matrix = sparse_matrix()
        h = remat.region(lambda t: torch.sparse.mm(matrix, t).sin(), "sparse", recompute=recompute)(x)
        return remat.region(lambda t: (t * 2.0).cos(), "dense", recompute=recompute)(h)
    return body


def returns_sparse(layout, recompute):
    def body(x):
        convert = (lambda t: t.to_sparse()) if layout == "coo" else (lambda t: t.to_sparse_csr())
        h = remat.region(lambda t: convert(t.relu() * 1.0), "sparse", recompute=recompute)(x)
        return h.to_dense().sin()
    return body


def gradient(step, x=None):
    x = torch.arange(32.0).view(4, 8).div(10).sub(1.0) if x is None else x
    x = x.clone().requires_grad_(True)
    step(x).sum().backward()
    return x.grad


def every_way(body, reference):
    """The body under a checkpoint, under CpuOffload, and profiled (per op too), each with gradients
    bitwise the reference's; returns the last profile."""
    run = remat.checkpoint(region_name="layer")(body)
    assert torch.equal(gradient(run), reference)
    with remat.CpuOffload():
        assert torch.equal(gradient(run), reference)
    profile = None
    with remat.tag_cpu_tensors():
        for ops in (False, True):
            with remat.profile_regions(ops=ops) as profile:
                assert torch.equal(gradient(run), reference)
            assert profile.step_peak_bytes > 0
    return profile


@pytest.mark.parametrize("recompute", [False, True], ids=["saved", "recomputed"])
def test_a_region_saving_a_sparse_tensor_runs_offloads_and_profiles(recompute):
    profile = every_way(saves_a_sparse_matrix(recompute), gradient(saves_a_sparse_matrix(True)))
    assert {region.name for region in profile.regions} == {"layer::sparse", "layer::dense"}


@pytest.mark.parametrize("layout", ["coo", "csr"])
@pytest.mark.parametrize("recompute", [False, True], ids=["saved", "recomputed"])
def test_a_region_returning_a_sparse_tensor_runs_offloads_and_profiles(layout, recompute):
    every_way(returns_sparse(layout, recompute), gradient(returns_sparse(layout, True)))


def test_plans_by_step_peak_run_regions_with_sparse_tensors():
    run = remat.checkpoint(region_name="layer")(saves_a_sparse_matrix(recompute=True))
    reference = gradient(saves_a_sparse_matrix(True))
    with remat.tag_cpu_tensors():
        with remat.profile_regions() as profile:
            gradient(run)
        for budget in (profile.least_peak_bytes(), profile.step_peak_bytes):
            with remat.use_plan(profile.plan(peak_bytes=budget)):
                assert torch.equal(gradient(run), reference)
        assert set(profile.plan(peak_bytes=profile.step_peak_bytes).decisions.values()) == {"save"}


class Wrapped(torch.Tensor):
    """A __torch_dispatch__ wrapper subclass: its storage has no data; the real tensor is `elem`."""

    @staticmethod
    def __new__(cls, elem):
        return torch.Tensor._make_wrapper_subclass(cls, elem.shape, dtype=elem.dtype, device=elem.device,
                                                   requires_grad=elem.requires_grad)

    def __init__(self, elem):
        self.elem = elem

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        def unwrap(t):
            return t.elem if isinstance(t, Wrapped) else t

        out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))
        return tree_map(lambda t: Wrapped(t) if isinstance(t, torch.Tensor) else t, out)


@pytest.mark.parametrize("recompute", [False, True], ids=["saved", "recomputed"])
def test_a_wrapper_subclass_runs_and_profiles(recompute):
    def body(x):
        return remat.region(lambda t: t.sin() * t, "a", recompute=recompute)(x)

    def unwrapped_gradient(step):
        x = Wrapped(torch.arange(6.0).div(7)).requires_grad_(True)
        step(x).sum().backward()
        return x.grad.elem

    reference = unwrapped_gradient(body)
    run = remat.checkpoint(region_name="layer")(body)
    assert torch.equal(unwrapped_gradient(run), reference)
    with remat.tag_cpu_tensors():
        for ops in (False, True):
            with remat.profile_regions(ops=ops):
                assert torch.equal(unwrapped_gradient(run), reference)


def nested(layout, *parts):
    return torch.nested.as_nested_tensor(list(parts), layout=layout)


@pytest.mark.parametrize("layout", [torch.strided, torch.jagged], ids=["strided", "jagged"])
def test_nested_tensors_are_refused_where_recompute_would_need_their_sizes(layout):
    x = torch.nested.nested_tensor([torch.rand(2, 3), torch.rand(4, 3)], layout=layout, requires_grad=True)
    with pytest.raises(remat.RematError, match="input 0 of checkpoint 'layer' is a nested tensor; checkpoints take "
                                               "strided tensors"):
        remat.checkpoint(region_name="layer")(lambda t: t.sin())(x)

    def saved_in_a_recompute_region(t):
        return remat.region(lambda u: (lambda n: (n * n).unbind()[0])(nested(layout, u[:2].sin(), u[1:].cos())),
                            "a")(t)

    # Raised in autograd's pack hook, which hands it on as a RuntimeError
    with pytest.raises(RuntimeError, match="a nested tensor is saved for backward in region 'layer::a', which "
                                            "recompute would make again.*make it a save region"):
        remat.checkpoint(region_name="layer")(saved_in_a_recompute_region)(torch.rand(4, 3, requires_grad=True))


@pytest.mark.parametrize("layout", [torch.strided, torch.jagged], ids=["strided", "jagged"])
def test_a_save_region_keeps_the_nested_tensors_it_makes(layout):
    def body(x):
        n = remat.region(lambda t: nested(layout, t[:2].sin(), t[1:].cos()), "nest", recompute=False)(x)
        return remat.region(lambda m: (m * m).unbind()[0].sum() + m.unbind()[1].sum(), "use", recompute=False)(n)

    x = torch.rand(4, 3, generator=torch.Generator().manual_seed(0))
    reference = gradient(body, x)
    run = remat.checkpoint(region_name="layer")(body)
    assert torch.equal(gradient(run, x), reference)
    for offload in (remat.CpuOffload(), remat.CpuOffload(min_bytes=0)):  # kept on the device as it is
        with offload:
            assert torch.equal(gradient(run, x), reference)
    with remat.tag_cpu_tensors():
        for ops in (False, True):  # the memory report lists the nested tensors kept, without a shape
            with remat.profile_regions(ops=ops):
                assert torch.equal(gradient(run, x), reference)
