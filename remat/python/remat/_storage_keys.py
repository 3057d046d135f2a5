"""How a profile names the storage behind a tensor: its Python storage object and the key (device,
data address) that the runtime's reports give too. A tensor PyTorch gives no storage of (a sparse
one, a wrapper subclass) has neither: the profile counts no bytes of it, as the runtime's reports
do not."""

from __future__ import annotations


def storage_of(tensor):
    """The tensor's untyped storage, or None where PyTorch gives none with data (a sparse tensor:
    "Cannot access storage of SparseTensorImpl"; a wrapper subclass: "Attempted to access the data
    pointer on an invalid python storage")."""
    try:
        storage = tensor.untyped_storage()
        storage.data_ptr()
    except RuntimeError:  # NotImplementedError, which a sparse tensor raises, is one
        return None
    return storage


def storage_key(tensor):
    """(device, data address) of the tensor's storage, or None where PyTorch gives none."""
    storage = storage_of(tensor)
    return None if storage is None else (str(tensor.device), storage.data_ptr())
