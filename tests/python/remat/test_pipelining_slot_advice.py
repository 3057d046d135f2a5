"""RecvSlotInUse's advice names a remedy that works for the ring the slot came from: a stage's own
ring takes pool_recv_buffers' slack; a shared ring (mode "shared_ring") takes no spare sets, so
there the advice is mode "ring" with a slack, or "just_in_time". In one process, no torch
process group: a slot handed to a microbatch while another still holds it (the same stage's, or on a shared ring
another stage's)."""

import pytest

_pool = pytest.importorskip("remat.pipelining._pool")


class _Stage:
    def __init__(self, index):
        self.stage_index = index


class _StagePool:
    def __init__(self, index):
        self.stage = _Stage(index)

    def missing(self, mb, direction):
        return [f"B{mb}"]


def _clash(shared: bool) -> str:
    storages = set()
    own = _pool._Ring(1, _pool.FORWARD, 3, storages)
    ring = _pool._Ring(1, _pool.FORWARD, 3, storages) if shared else own
    ring.sets = [[]]
    holder = _pool._Receiver(_StagePool(3), _pool.FORWARD, "ring", ring, [0, 0], own, [0, 0])
    taker = _pool._Receiver(_StagePool(7), _pool.FORWARD, "ring", ring, [0, 0], own, [0, 0]) if shared else holder
    for receiver in (holder, taker):
        receiver.received = [[], []]  # no records: the clash is the slot's, before any buffer is set
    holder.post(0)
    with pytest.raises(_pool.RecvSlotInUse) as caught:
        taker.post(1)
    return str(caught.value)


def test_a_stages_own_ring_is_advised_a_larger_slack():
    message = _clash(shared=False)
    assert "receive slot 0 is handed to microbatch 1 while microbatch 0 of stage 3 still needs it" in message
    assert "give pool_recv_buffers a larger slack" in message


def test_a_shared_ring_is_advised_per_stage_rings_not_a_slack_it_ignores():
    message = _clash(shared=True)
    assert "stage 3 (a shared ring)" in message
    assert "larger slack" not in message
    assert 'mode="ring" and a slack' in message and 'mode="just_in_time"' in message
