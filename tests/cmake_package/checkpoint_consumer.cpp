#include <remat/remat.hpp>

#include <ATen/ATen.h>

#include <cstdio>

int main() {
  auto x = at::rand({8}).requires_grad_(true);
  auto loss = remat::checkpoint({.region_name = "consumer"})(
      [](const at::Tensor& in) { return remat::region([](const at::Tensor& t) { return t.exp().sum(); }, "r")(in); })(x);
  loss.backward();
  const bool ok = at::allclose(x.grad(), x.detach().exp());
  std::printf("checkpointed gradient %s\n", ok ? "matches" : "differs");
  return ok ? 0 : 1;
}
