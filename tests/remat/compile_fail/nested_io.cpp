// Must not compile: checkpoint and region inputs and outputs are a tensor or one level of
// tuple/vector of tensors. Each function below nests deeper in a different way; the test
// expects one clear static_assert message per function.

#include <remat/remat.hpp>

#include <tuple>
#include <vector>

using at::Tensor;

std::vector<std::vector<Tensor>> nested_vector_output(const Tensor& x) {
  return remat::checkpoint({.region_name = "nested.vector"})(
      [](const Tensor& t) { return std::vector<std::vector<Tensor>>{{t}}; })(x);
}

std::tuple<Tensor, std::vector<Tensor>> vector_inside_tuple_output(const Tensor& x) {
  return remat::checkpoint({.region_name = "nested.tuple"})(
      [](const Tensor& t) { return std::tuple<Tensor, std::vector<Tensor>>{t, {t}}; })(x);
}

Tensor tuple_inside_vector_input(const std::vector<std::tuple<Tensor>>& xs) {
  return remat::region([](const std::vector<std::tuple<Tensor>>& v) { return std::get<0>(v.front()); }, "nested.input")(xs);
}
