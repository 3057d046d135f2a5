#pragma once
// A small pre-norm transformer block (attention, MLP with optional dropout) and gradient
// helpers, shared by the CPU and CUDA parity tests.

#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>
#include <vector>

namespace remat::testing {

struct Block {
  at::Tensor ln1_w, ln1_b, wq, wk, wv, wo, ln2_w, ln2_b, w1, w2;
  static constexpr std::int64_t D = 16;

  // The same values on every device: drawn on the CPU from seed 1, then moved.
  static Block make(at::Device device = at::kCPU) {
    at::manual_seed(1);
    auto p = [device](std::vector<std::int64_t> shape, double scale) {
      return (at::randn(shape) * scale).to(device).requires_grad_(true);
    };
    return {p({D}, 1.0), p({D}, 0.1), p({D, D}, 0.25), p({D, D}, 0.25), p({D, D}, 0.25), p({D, D}, 0.25),
            p({D}, 1.0), p({D}, 0.1), p({4 * D, D}, 0.25), p({D, 4 * D}, 0.25)};
  }
  std::vector<at::Tensor> parameters() const { return {ln1_w, ln1_b, wq, wk, wv, wo, ln2_w, ln2_b, w1, w2}; }

  at::Tensor attention(const at::Tensor& x) const {
    auto h = at::layer_norm(x, {D}, ln1_w, ln1_b);
    auto q = at::linear(h, wq), k = at::linear(h, wk), v = at::linear(h, wv);
    auto scores = at::softmax(at::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(D)), -1);
    return x + at::linear(at::matmul(scores, v), wo);
  }
  at::Tensor mlp(const at::Tensor& y, double dropout = 0.0) const {
    auto m = at::layer_norm(y, {D}, ln2_w, ln2_b);
    auto hidden = at::gelu(at::linear(m, w1));
    if (dropout > 0) hidden = at::dropout(hidden, dropout, /*train=*/true);
    return y + at::linear(hidden, w2);
  }
};

// Gradients of the parameters, then of x.
inline std::vector<at::Tensor> gradients(const Block& block, const at::Tensor& x) {
  std::vector<at::Tensor> out;
  for (const auto& p : block.parameters()) out.push_back(p.grad().clone());
  out.push_back(x.grad().clone());
  return out;
}

inline void zero_grads(const Block& block, const at::Tensor& x) {
  for (auto p : block.parameters()) p.mutable_grad() = at::Tensor();
  const_cast<at::Tensor&>(x).mutable_grad() = at::Tensor();
}

}  // namespace remat::testing
