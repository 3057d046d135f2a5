#pragma once
// The tensors a Python body holds outside its arguments: the parameters and buffers of the
// modules its function reaches (note_leaves_held_by_the_body).

#include <remat/remat.hpp>

#include <torch/csrc/utils/pybind.h>

namespace remat::python {

// The parameters and buffers, as they stand, of every torch.nn.Module reached from `fn` (the
// module itself; a bound method's object; a functools.partial's function and arguments; the cells
// of a function's closure, and of functions found there, a few levels deep) or among `positional`
// (a decorated method's self). Needs the GIL.
TensorList leaves_held(const pybind11::handle& fn, const pybind11::tuple& positional);

}  // namespace remat::python
