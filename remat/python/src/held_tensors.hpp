#pragma once
// The tensors a Python body holds outside its arguments: the parameters and buffers of the modules
// its function reaches (note_tensors_held_by_the_body, note_buffers_held_by_the_body).

#include <remat/remat.hpp>

#include <torch/csrc/utils/pybind.h>

namespace remat::python {

// The parameters and buffers, as they stand, of every torch.nn.Module reached from `fn` (the
// module itself; a bound method's object; a functools.partial's function and arguments, by
// keyword too; the cells of a function's closure, and of functions found there, a few levels deep,
// with the modules in lists, tuples and dicts found there; the modules among a function's defaults
// and among the globals its code names; the modules among the attributes of another object
// reached, a callable one or a method's) or among the call's arguments, `args_and_kwargs`, or in a
// list, tuple or dict there (a decorated method's self, a module passed by keyword, layers passed
// as a list). A norm layer's running statistics are left out while it trains: batch norm saves
// them there, but its gradients never read them. Needs the GIL.
TensorList tensors_held(const pybind11::handle& fn, const pybind11::tuple& args_and_kwargs);

// The buffers and parameters of the same modules, all of them (a lazy module's parameters before its
// first forward left out), each with its module's mode and its name (note_buffers_held_by_the_body).
std::vector<HeldBuffer> buffers_held(const pybind11::handle& fn, const pybind11::tuple& args_and_kwargs);

}  // namespace remat::python
