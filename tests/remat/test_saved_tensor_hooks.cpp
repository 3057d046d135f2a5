// Saved-tensor hooks in the C++ runtime: which tensors each pair takes, with which kind and
// context, when they come back, and that gradients stay exact.

#include "support.hpp"

#include <remat/saved_tensor_hooks.hpp>

#include <algorithm>
#include <string>
#include <vector>

namespace {

using remat::SavedTensorKind;

// Holds a copy of each packed tensor (as an offloader would) and logs kinds and contexts.
class CopyingHooks final : public remat::SavedTensorHooks {
 public:
  explicit CopyingHooks(int context = -1) : context_(context) {}

  std::any capture_context() override { return context_; }
  bool captures_context() const override { return context_ >= 0; }

  std::any pack(const at::Tensor& tensor) override {
    const remat::SavedTensorInfo& info = remat::current_saved_tensor_info();
    kinds.push_back(info.kind);
    contexts.push_back(info.context->has_value() ? std::any_cast<int>(*info.context) : -1);
    return tensor.clone();
  }
  at::Tensor unpack(const std::any& payload) override {
    ++unpacks;
    return std::any_cast<const at::Tensor&>(payload);
  }

  std::vector<SavedTensorKind> kinds;
  std::vector<int> contexts;
  int unpacks = 0;

 private:
  int context_;
};

at::Tensor attention_like(const at::Tensor& x) { return (x * 2.0).sin(); }
at::Tensor mlp_like(const at::Tensor& h) { return (h * 3.0).cos(); }

// x -> save region (sin saves its input) -> recompute region reading the save region's output.
at::Tensor block(const at::Tensor& x) {
  at::Tensor h = remat::region(attention_like, "attention", /*recompute=*/false)(x);
  return remat::region(mlp_like, "mlp")(h);
}

at::Tensor reference_grad(const at::Tensor& x) {
  auto leaf = x.detach().requires_grad_(true);
  block(leaf * 1.0).sum().backward();
  return leaf.grad();
}

TEST(SavedTensorHooks, TheCheckpointPairTakesInputsSavedTensorsAndPersistedOutputs) {
  auto hooks = std::make_shared<CopyingHooks>();
  auto x = at::rand({4, 3}).requires_grad_(true);
  const at::Tensor input = x * 1.0;  // not a leaf: the checkpoint keeps it for recompute
  remat::checkpoint({.region_name = "layers.0", .saved_tensor_hooks = hooks})(block)(input).sum().backward();
  // sin saved its input (BACKWARD), the mlp reads attention's output (SAVE_OUTPUT, packed when
  // forward ends), and the input the mlp region's recompute starts from is not needed: the
  // recompute region reads only the save region's output.
  std::vector<SavedTensorKind> kinds = hooks->kinds;
  std::sort(kinds.begin(), kinds.end());
  EXPECT_EQ(kinds, (std::vector<SavedTensorKind>{SavedTensorKind::backward, SavedTensorKind::save_output}));
  EXPECT_EQ(hooks->unpacks, 2);  // the output in recompute, the saved tensor in backward
  EXPECT_TRUE(at::allclose(x.grad(), reference_grad(x)));
}

TEST(SavedTensorHooks, AnInputRecomputeReadsIsPackedAsACheckpointInput) {
  auto hooks = std::make_shared<CopyingHooks>();
  auto x = at::rand({5}).requires_grad_(true);
  const at::Tensor input = x * 1.0;
  remat::checkpoint({.region_name = "plain", .saved_tensor_hooks = hooks})(
      [](const at::Tensor& t) { return (t.sin() * t).sum(); })(input)
      .backward();
  EXPECT_EQ(hooks->kinds, (std::vector<SavedTensorKind>{SavedTensorKind::checkpoint_input}));
  EXPECT_EQ(hooks->unpacks, 1);
  const at::Tensor expected = x.detach().sin() + x.detach() * x.detach().cos();
  EXPECT_TRUE(at::allclose(x.grad(), expected));
}

TEST(SavedTensorHooks, AScopeAroundTheCallAppliesAndItsContextReachesADeferredPack) {
  auto hooks = std::make_shared<CopyingHooks>(/*context=*/7);
  auto x = at::rand({3}).requires_grad_(true);
  at::Tensor y;
  {
    remat::SavedTensorHooksScope scope(hooks);
    y = remat::checkpoint({.region_name = "scoped"})(block)(x * 1.0);
  }
  // The save region's output is packed when forward ends, inside the scope's lifetime here, but
  // the context is the one captured where the region ran.
  ASSERT_EQ(hooks->contexts.size(), 2u);
  EXPECT_EQ(hooks->contexts, (std::vector<int>{7, 7}));
  y.sum().backward();
  EXPECT_TRUE(at::allclose(x.grad(), reference_grad(x)));
}

TEST(SavedTensorHooks, AScopeInsideTheBodyWinsOverTheCheckpointPairForItsSaveRegions) {
  auto outer = std::make_shared<CopyingHooks>();
  auto inner = std::make_shared<CopyingHooks>();
  auto x = at::rand({3}).requires_grad_(true);
  remat::checkpoint({.region_name = "inner.wins", .saved_tensor_hooks = outer})([&](const at::Tensor& t) {
    remat::SavedTensorHooksScope scope(inner);
    return remat::region(attention_like, "attention", /*recompute=*/false)(t);
  })(x * 1.0)
      .sum()
      .backward();
  EXPECT_EQ(inner->kinds, (std::vector<SavedTensorKind>{SavedTensorKind::backward}));
  EXPECT_TRUE(outer->kinds.empty());
}

TEST(SavedTensorHooks, WithoutAPairNothingIsPackedAndTheInfoIsRefused) {
  EXPECT_THROW(remat::current_saved_tensor_info(), remat::Error);
  EXPECT_EQ(remat::active_saved_tensor_hooks(), nullptr);
  auto x = at::rand({3}).requires_grad_(true);
  remat::checkpoint({.region_name = "none"})(block)(x * 1.0).sum().backward();
  EXPECT_TRUE(at::allclose(x.grad(), reference_grad(x)));
}

TEST(SavedTensorHooks, ASavedTensorChangedInPlaceAfterTheSaveIsAnErrorNotAWrongGradient) {
  auto x = at::rand({4}).requires_grad_(true);
  at::Tensor kept;
  auto y = remat::checkpoint({.region_name = "mutated"})([&](const at::Tensor& t) {
    return remat::region(
        [&](const at::Tensor& u) {
          kept = u * 2.0;
          return kept.sin();  // sin saves `kept`
        },
        "attention", /*recompute=*/false)(t);
  })(x * 1.0);
  kept.mul_(3.0);
  try {
    y.sum().backward();
    FAIL() << "backward used a saved tensor changed in place";
  } catch (const std::exception& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("of region 'mutated::attention' was modified in-place after it was saved"),
              std::string::npos)
        << message;
  }
}

}  // namespace
