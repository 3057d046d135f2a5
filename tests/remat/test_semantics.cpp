// The checkpoint semantics of shared/DESIGN.md: residency per save/recompute policy,
// placeholders, early stop, no-grad, retain_graph and the misuse errors.

#include "support.hpp"

#include <remat/alloc/tags.hpp>

#include <algorithm>
#include <map>
#include <optional>

using remat::testing::float_bytes;

namespace {

constexpr std::int64_t N = 1000;  // elements per tensor

struct Chain {
  bool a_saves = false;
  bool b_saves = false;
  std::string name = "ckpt";
  std::map<std::string, int> runs;  // region body executions

  // A: p = exp(x) (autograd saves p), y = 3p.  B: q = exp(y), z = 3q.  C: sum(3z).
  at::Tensor forward(const at::Tensor& x) {
    return remat::checkpoint({.region_name = name})([this](const at::Tensor& in) {
      auto y = remat::region(
          [this](const at::Tensor& t) {
            ++runs["A"];
            return t.exp() * 3.0;
          },
          "A", !a_saves)(in);
      auto z = remat::region(
          [this](const at::Tensor& t) {
            ++runs["B"];
            return t.exp() * 3.0;
          },
          "B", !b_saves)(y);
      return remat::region(
          [this](const at::Tensor& t) {
            ++runs["C"];
            return (t * 3.0).sum();
          },
          "C")(z);
    })(x);
  }
};

at::Tensor reference_loss(const at::Tensor& x) { return ((x.exp() * 3.0).exp() * 3.0 * 3.0).sum(); }

// Runs the chain on x = 2w, tagged "input", that only the checkpoint can keep alive.
at::Tensor run_with_fresh_input(Chain& chain, const at::Tensor& w) {
  at::Tensor x;
  {
    auto input_scope = remat::alloc::TagScope::region("input");
    x = w * 2.0;
  }
  return chain.forward(x);
}

std::int64_t resident_bytes(const Chain& chain) {
  return remat::live_bytes("input") + remat::live_bytes(chain.name + "::A") + remat::live_bytes(chain.name + "::B");
}

struct ResidencyCase {
  bool a_saves;
  bool b_saves;
  std::int64_t resident_tensors;  // of N floats each
  int a_runs;
  int b_runs;
};

class Residency : public ::testing::TestWithParam<ResidencyCase> {};

TEST_P(Residency, ResidentBytesAndRecomputedTensorsMatchTheTable) {
  const ResidencyCase c = GetParam();
  at::manual_seed(0);
  auto w = (at::rand({N}) * 0.1).requires_grad_(true);
  // A name per case: what one case's calls teach the runtime must not reach another.
  Chain chain{c.a_saves, c.b_saves, ::testing::UnitTest::GetInstance()->current_test_info()->name(), {}};
  at::Tensor loss = run_with_fresh_input(chain, w);
  EXPECT_EQ(resident_bytes(chain), float_bytes(c.resident_tensors * N));
  loss.backward();
  EXPECT_EQ(chain.runs["A"], c.a_runs);
  EXPECT_EQ(chain.runs["B"], c.b_runs);
  EXPECT_EQ(chain.runs["C"], 1);  // recompute stops before C: nothing after B is needed

  auto w_ref = w.detach().clone().requires_grad_(true);
  reference_loss(w_ref * 2.0).backward();
  EXPECT_TRUE(at::equal(w.grad(), w_ref.grad()));
  loss = at::Tensor();
  EXPECT_EQ(remat::live_bytes(chain.name), 0);
  EXPECT_EQ(remat::live_bytes("input"), 0);
}

// shared/DESIGN.md: save/save keeps y, z, p, q; save/recompute keeps y, p and recreates z, q;
// recompute/save keeps x, z, q and recreates y, p; recompute/recompute keeps x only.
INSTANTIATE_TEST_SUITE_P(Table, Residency,
                         ::testing::Values(ResidencyCase{true, true, 4, 1, 1}, ResidencyCase{true, false, 2, 1, 2},
                                           ResidencyCase{false, true, 3, 2, 1}, ResidencyCase{false, false, 1, 2, 2}),
                         [](const auto& param_info) {
                           return std::string(param_info.param.a_saves ? "Save" : "Recompute") +
                                  (param_info.param.b_saves ? "Save" : "Recompute");
                         });

// A checkpoint whose last call ran no save region keeps every input without watching which
// are read. When it runs a save region again (A saved, B recomputed), that call still keeps them;
// the next one drops an input that only save regions read, as the table says.
TEST(Residency, InputsOfACheckpointThatStartsSavingAreDroppedFromItsNextCall) {
  at::manual_seed(0);
  auto w = (at::rand({N}) * 0.1).requires_grad_(true);
  Chain chain{false, false, "starts.saving", {}};
  const std::int64_t x_bytes = float_bytes(N);
  const std::vector<std::pair<bool, std::int64_t>> calls = {
      {false, x_bytes},                      // recompute/recompute: x
      {true, float_bytes(2 * N) + x_bytes},  // save/recompute: y, p, and x kept as before
      {true, float_bytes(2 * N)},            // save/recompute: y, p
  };
  for (const auto& [saves, expected] : calls) {
    chain.a_saves = saves;
    at::Tensor loss = run_with_fresh_input(chain, w);
    EXPECT_EQ(resident_bytes(chain), expected) << (saves ? "save/recompute" : "recompute/recompute");
    w.mutable_grad() = at::Tensor();
    loss.backward();
    auto w_ref = w.detach().clone().requires_grad_(true);
    reference_loss(w_ref * 2.0).backward();
    EXPECT_TRUE(at::equal(w.grad(), w_ref.grad()));
    loss = at::Tensor();
    EXPECT_EQ(remat::live_bytes("input"), 0);
  }
}

// What a caller keeps with a checkpoint call comes back while that call's body runs: in forward,
// in recompute (on autograd's thread) and without grad; never outside a body, nor after one
// that threw.
struct NamedCaller : remat::CheckpointCaller {};

TEST(Caller, IsHandedBackWhileItsCallsBodyRunsInForwardRecomputeAndWithoutGrad) {
  const auto caller = std::make_shared<NamedCaller>();
  std::vector<std::pair<std::string, remat::CheckpointCaller*>> seen;
  auto body = [&](const at::Tensor& in) {
    seen.emplace_back(remat::is_recomputing() ? "recompute" : "forward", remat::checkpoint_caller());
    return in.exp().sum();  // exp's saved result makes recompute run the body
  };
  EXPECT_EQ(remat::checkpoint_caller(), nullptr);
  const auto x = at::rand({4}).requires_grad_(true);
  remat::checkpoint({.region_name = "layers.0", .caller = caller})(body)(x).backward();
  {
    at::NoGradGuard no_grad;
    remat::checkpoint({.region_name = "layers.0", .caller = caller})(body)(x);
  }
  remat::checkpoint({.region_name = "plain"})(body)(x).backward();
  const std::vector<std::pair<std::string, remat::CheckpointCaller*>> expected = {
      {"forward", caller.get()}, {"recompute", caller.get()}, {"forward", caller.get()},
      {"forward", nullptr},      {"recompute", nullptr}};
  EXPECT_EQ(seen, expected);
  EXPECT_EQ(remat::checkpoint_caller(), nullptr);

  auto throws = [](const at::Tensor& in) -> at::Tensor { throw std::runtime_error("body failed on " + in.toString()); };
  EXPECT_ANY_THROW(remat::checkpoint({.region_name = "layers.1", .caller = caller})(throws)(x));
  EXPECT_EQ(remat::checkpoint_caller(), nullptr);
}

// y = a save region's output that forward's code never reads; recompute reads it on a path
// forward did not take, so it is a placeholder unless marked.
struct PlaceholderProbe {
  bool mark = false;
  bool mark_view = false;
  std::vector<std::int64_t> seen_sizes;
  std::vector<std::int64_t> seen_strides;
  std::vector<std::int64_t> seen_view_sizes;
  at::ScalarType seen_dtype = at::kByte;
  at::Tensor read;

  at::Tensor run(const at::Tensor& x) {
    return remat::checkpoint({.region_name = "probe"})([this](const at::Tensor& in) {
      auto y = remat::region([](const at::Tensor& t) { return (t * 2.0).t(); }, "producer", /*recompute=*/false)(in);
      if (mark) remat::recompute_needs_tensor(y);
      if (mark_view) remat::recompute_needs_tensor(y.select(0, 1));
      if (remat::is_recomputing()) {
        seen_sizes = y.sizes().vec();
        seen_strides = y.strides().vec();
        seen_dtype = y.scalar_type();
        seen_view_sizes = y.transpose(0, 1).sizes().vec();
        read = (y * 5.0).detach();  // reads y's data
      }
      return in.exp().sum();  // exp's saved result makes recompute run the body
    })(x);
  }
};

TEST(Placeholders, HaveShapeStridesAndDtypeAndViewsWork) {
  auto x = at::rand({3, 4}).requires_grad_(true);
  PlaceholderProbe probe;
  probe.mark = true;
  probe.run(x).backward();
  EXPECT_EQ(probe.seen_sizes, (std::vector<std::int64_t>{4, 3}));
  EXPECT_EQ(probe.seen_strides, (std::vector<std::int64_t>{1, 4}));
  EXPECT_EQ(probe.seen_dtype, at::kFloat);
  EXPECT_EQ(probe.seen_view_sizes, (std::vector<std::int64_t>{3, 4}));
}

TEST(Placeholders, ReadingDataNamesTheRegionAndTheFix) {
  auto x = at::rand({3, 4}).requires_grad_(true);
  PlaceholderProbe probe;
  auto loss = probe.run(x);
  try {
    loss.backward();
    FAIL() << "reading a placeholder must raise";
  } catch (const std::exception& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("save region 'probe::producer'"), std::string::npos) << message;
    EXPECT_NE(message.find("recompute_needs_tensor"), std::string::npos) << message;
  }
  EXPECT_EQ(probe.seen_sizes, (std::vector<std::int64_t>{4, 3}));  // metadata was readable
}

TEST(Placeholders, MarkingFixesTheReadAndGradientsAreExact) {
  auto x = at::rand({3, 4}).requires_grad_(true);
  PlaceholderProbe probe;
  probe.mark = true;
  probe.run(x).backward();
  EXPECT_TRUE(at::equal(probe.read, (x.detach() * 2.0).t() * 5.0));
  EXPECT_TRUE(at::equal(x.grad(), x.detach().exp()));
}

TEST(Placeholders, AnOutputReadByCodeRecomputeRunsAgainIsPersistedWithoutMarking) {
  auto x = at::rand({3, 4}).requires_grad_(true);
  auto loss = remat::checkpoint({.region_name = "persisted.residual"})([](const at::Tensor& in) {
    auto h = remat::region([](const at::Tensor& t) { return (t * 2.0).exp(); }, "attention", /*recompute=*/false)(in);
    return (remat::region([](const at::Tensor& t) { return t.tanh(); }, "mlp")(h + in) + h).pow(2).sum();
  })(x);
  loss.backward();
  auto x_ref = x.detach().clone().requires_grad_(true);
  auto h = (x_ref * 2.0).exp();
  ((h + x_ref).tanh() + h).pow(2).sum().backward();
  EXPECT_TRUE(at::equal(x.grad(), x_ref.grad()));
}

TEST(Placeholders, AnInputOnlyASaveRegionReadHasForwardsRequiresGradInRecompute) {
  // The body branches on the input's flag, as a fused kernel's inference path does; recompute,
  // which does not keep the input (only the save region read its data), must take forward's branch.
  auto act = [](const at::Tensor& h, const at::Tensor& in) { return in.requires_grad() ? h.tanh() : h.sigmoid(); };
  std::vector<bool> seen;
  auto x = at::rand({3, 4}).requires_grad_(true);
  auto loss = remat::checkpoint({.region_name = "flag"})([&](const at::Tensor& in) {
    seen.push_back(in.requires_grad());
    auto h = remat::region([](const at::Tensor& t) { return t * 2.0; }, "proj", /*recompute=*/false)(in);
    return act(h, in).exp().sum();
  })(x);
  loss.backward();
  EXPECT_EQ(seen, (std::vector<bool>{true, true}));
  auto x_ref = x.detach().clone().requires_grad_(true);
  act(x_ref * 2.0, x_ref).exp().sum().backward();
  EXPECT_TRUE(at::equal(x.grad(), x_ref.grad()));
}

TEST(Placeholders, MarkingAViewPersistsItsBase) {
  auto x = at::rand({3, 4}).requires_grad_(true);
  PlaceholderProbe probe;
  probe.mark_view = true;
  EXPECT_NO_THROW(probe.run(x).backward());
}

TEST(Placeholders, MarkingOutsideACheckpointOrARecomputeOutputIsANoOp) {
  auto t = at::rand({2});
  remat::recompute_needs_tensor(t);  // outside any checkpoint
  auto x = at::rand({4}).requires_grad_(true);
  auto loss = remat::checkpoint({.region_name = "noop"})([](const at::Tensor& in) {
    auto h = remat::region([](const at::Tensor& v) { return v.exp(); }, "r")(in);
    remat::recompute_needs_tensor(h);  // a recompute region's output: nothing to persist
    return h.sum();
  })(x);
  EXPECT_EQ(remat::live_bytes("noop::r"), 0);
  loss.backward();
  EXPECT_TRUE(at::allclose(x.grad(), x.detach().exp()));
}

TEST(EarlyStop, RecomputeRunsNoFurtherThanTheLastTensorBackwardNeeds) {
  std::map<std::string, int> runs;
  auto x = at::rand({8}).requires_grad_(true);
  auto loss = remat::checkpoint({.region_name = "stop"})([&](const at::Tensor& in) {
    auto a = remat::region([&](const at::Tensor& t) { ++runs["a"]; return t.sin(); }, "a")(in);
    auto b = remat::region([&](const at::Tensor& t) { ++runs["b"]; return t * 2.0; }, "b")(a);
    auto c = remat::region([&](const at::Tensor& t) { ++runs["c"]; return t + 1.0; }, "c")(b);
    return c.sum();
  })(x);
  loss.backward();
  // Only sin saves a tensor (its input); b and c save nothing, so recompute stops after a.
  EXPECT_EQ(runs["a"], 2);
  EXPECT_EQ(runs["b"], 1);
  EXPECT_EQ(runs["c"], 1);
  EXPECT_TRUE(at::allclose(x.grad(), x.detach().cos() * 2.0));
}

TEST(EarlyStop, WorkAfterTheLastNeededTensorThatBuildsNoGraphMayReadAPlaceholder) {
  int tail_runs = 0;
  auto x = at::rand({8}).requires_grad_(true);
  auto y = remat::checkpoint({.region_name = "tail"})([&](const at::Tensor& in) {
    // Scaling saves nothing, so this save region's output is not persisted.
    auto scaled = remat::region([](const at::Tensor& t) { return t * 3.0; }, "scale", /*recompute=*/false)(in);
    auto out = in.sin();  // the last tensor backward needs
    at::NoGradGuard no_grad;
    ++tail_runs;
    EXPECT_GT(scaled.sum().item<float>(), 0.0F);  // no graph node: recompute runs it and reads a placeholder
    return out;
  })(x);
  y.sum().backward();
  EXPECT_EQ(tail_runs, 2);
  EXPECT_TRUE(at::allclose(x.grad(), x.detach().cos()));
}

TEST(NoGrad, RunsTheBodyOnceAndRegistersNothing) {
  remat::collect_trace();  // forget earlier tests' checkpoints
  int runs = 0;
  auto x = at::rand({4});
  at::NoGradGuard no_grad;
  auto y = remat::checkpoint({.region_name = "nograd"})([&](const at::Tensor& in) {
    return remat::region([&](const at::Tensor& t) { ++runs; return t.exp(); }, "r", false)(in);
  })(x);
  EXPECT_EQ(runs, 1);
  EXPECT_FALSE(y.requires_grad());
  EXPECT_TRUE(remat::collect_trace().scopes.empty());
}

TEST(RetainGraph, ASecondBackwardRecomputesAgainAndAccumulates) {
  int runs = 0;
  auto x = at::rand({5}).requires_grad_(true);
  auto loss = remat::checkpoint({.region_name = "twice"})([&](const at::Tensor& in) {
    return remat::region([&](const at::Tensor& t) { ++runs; return t.exp().sum(); }, "r")(in);
  })(x);
  loss.backward({}, /*retain_graph=*/true);
  loss.backward();
  EXPECT_EQ(runs, 3);  // forward, then one recompute per backward
  EXPECT_TRUE(at::allclose(x.grad(), 2.0 * x.detach().exp()));
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const remat::Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(Misuse, DuplicateRegionNamesAreAClearError) {
  auto x = at::rand({2}).requires_grad_(true);
  const std::string message = error_of([&] {
    remat::checkpoint({.region_name = "dup"})([](const at::Tensor& in) {
      auto a = remat::region([](const at::Tensor& t) { return t * 2.0; }, "same")(in);
      return remat::region([](const at::Tensor& t) { return t * 3.0; }, "same")(a);
    })(x);
  });
  EXPECT_NE(message.find("region 'same' appears twice in checkpoint 'dup'"), std::string::npos) << message;
}

TEST(Misuse, RecomputeRegionInsideASaveRegionIsAClearError) {
  auto x = at::rand({2}).requires_grad_(true);
  const std::string message = error_of([&] {
    remat::checkpoint({.region_name = "outer"})([](const at::Tensor& in) {
      return remat::region(
          [](const at::Tensor& t) { return remat::region([](const at::Tensor& u) { return u * 2.0; }, "inner")(t); },
          "outer_region", /*recompute=*/false)(in);
    })(x);
  });
  EXPECT_NE(message.find("region 'inner' (recompute=True) is nested inside a recompute=False (save) region, "
                         "'outer::outer_region'"),
            std::string::npos)
      << message;
}

TEST(Misuse, NestedCheckpointsAreAClearError) {
  auto x = at::rand({2}).requires_grad_(true);
  const std::string message = error_of([&] {
    remat::checkpoint({.region_name = "outer"})([](const at::Tensor& in) {
      return remat::checkpoint({.region_name = "inner"})([](const at::Tensor& t) { return t * 2.0; })(in);
    })(x);
  });
  EXPECT_NE(message.find("checkpoints do not nest"), std::string::npos) << message;
}

TEST(Misuse, PreserveRngStateIsRejectedWithTheAlternative) {
  auto x = at::rand({2}).requires_grad_(true);
  const std::string message = error_of([&] {
    remat::checkpoint({.region_name = "rng", .preserve_rng_state = true})([](const at::Tensor& t) { return t * 2.0; })(x);
  });
  EXPECT_NE(message.find("preserve_rng_state is not supported"), std::string::npos) << message;
  EXPECT_NE(message.find("cpu_rng_state_hook"), std::string::npos) << message;
}

TEST(Misuse, TupleAndVectorOutputsWorkOneLevelDeep) {
  auto x = at::rand({3}).requires_grad_(true);
  auto [a, b] = remat::checkpoint({.region_name = "tuple"})([](const at::Tensor& in) {
    return remat::region([](const at::Tensor& t) { return std::make_tuple(t.exp(), t.sin()); }, "pair")(in);
  })(x);
  auto parts = remat::checkpoint({.region_name = "vector"})([](const std::vector<at::Tensor>& in) {
    return std::vector<at::Tensor>{in[0].cos(), in[1].exp()};
  })(std::vector<at::Tensor>{x, x});
  (a.sum() + b.sum() + parts[0].sum() + parts[1].sum()).backward();
  const auto xd = x.detach();
  EXPECT_TRUE(at::allclose(x.grad(), 2 * xd.exp() + xd.cos() - xd.sin()));
}

}  // namespace

// A save region that saves (a view of) an input recompute makes again keeps nothing for it:
// backward takes the view from the recomputed input, as torch_remat re-derives it.
TEST(Residency, ASaveRegionsSavedInputThatRecomputeRecreatesIsNotKept) {
  auto x = at::rand({3, 4}).requires_grad_(true);
  std::int64_t kept_bytes = -1;
  auto body = [&kept_bytes](const at::Tensor& in) {
    at::Tensor y = remat::region([](const at::Tensor& t) { return t * 3.0; }, "producer")(in);
    at::Tensor out = remat::region(
        [](const at::Tensor& u) { return u.slice(1, 0, 2) * u.slice(1, 2, 4); },  // mul saves both views of u
        "consumer", /*recompute=*/false)(y);
    if (!remat::is_recomputing()) kept_bytes = remat::current_memory_report().bytes;
    return out;
  };
  remat::checkpoint({.region_name = "ferry"})(body)(x).sum().backward();
  // Only the checkpoint's input (the producer reads it) is kept; neither y nor its views.
  EXPECT_EQ(kept_bytes, remat::testing::float_bytes(12));
  const at::Tensor xd = x.detach();
  const at::Tensor expected = at::cat({xd.slice(1, 2, 4) * 9.0, xd.slice(1, 0, 2) * 9.0}, 1);
  EXPECT_TRUE(at::allclose(x.grad(), expected));
}

namespace {

// A decoder layer's shape: a norm, attention (a matmul: its output saved by nothing), the residual
// sum made by code between regions, a second norm that saves that sum, and the second residual.
struct ResidualLayer {
  at::Tensor w = at::rand({8, 8}).requires_grad_(true);
  bool attention_saves = true;
  int recomputes = 0;  // runs of the body in recompute
  std::map<std::string, int> runs;  // region bodies run, in forward and recompute

  static at::Tensor rms(const at::Tensor& t) { return t * t.pow(2).mean(-1, true).add(1e-6).rsqrt(); }

  at::Tensor body(const at::Tensor& x) {
    if (remat::is_recomputing()) ++recomputes;
    auto counted = [this](const std::string& name, auto fn) {
      return [this, name, fn](const at::Tensor& t) {
        ++runs[name];
        return fn(t);
      };
    };
    at::Tensor n = remat::region(counted("norm", rms), "norm", /*recompute=*/false)(x);
    at::Tensor a = remat::region(counted("attention", [this](const at::Tensor& t) { return t.matmul(w); }),
                                 "attention", !attention_saves)(n);
    at::Tensor r = x + a;  // saves nothing
    at::Tensor m = remat::region(counted("post_norm", rms), "post_norm", /*recompute=*/false)(r);
    return r + m;
  }
};

}  // namespace

// Where nothing else is recomputed, the residual sum a save region saves is kept, as autograd keeps
// it without the checkpoint, instead of being made again by recompute (which would need
// attention's output kept for the add): recompute never runs, and the checkpoint keeps what
// autograd would (x and the first norm's output, each norm's rsqrt, the sum).
TEST(Residency, AnAllSavedLayerKeepsTheResidualSumItsNormSavesAndRecomputesNothing) {
  ResidualLayer layer;
  const at::Tensor x0 = at::rand({4, 8});
  auto x = x0.clone().requires_grad_(true);
  at::Tensor y =
      remat::checkpoint({.region_name = "layer"})([&](const at::Tensor& in) { return layer.body(in); })(x * 1.0);
  const std::vector<remat::MemoryReport> reports = remat::live_checkpoint_reports();
  ASSERT_EQ(reports.size(), 1U);
  EXPECT_EQ(reports[0].bytes, remat::testing::float_bytes(3 * 32 + 2 * 4));
  y.sum().backward({}, /*retain_graph=*/true);
  y.sum().backward();  // the kept sum serves a second backward too
  EXPECT_EQ(layer.recomputes, 0);
  EXPECT_EQ(layer.runs, (std::map<std::string, int>{{"attention", 1}, {"norm", 1}, {"post_norm", 1}}));

  ResidualLayer plain;
  plain.w = layer.w.detach().clone().requires_grad_(true);
  auto x_plain = x0.clone().requires_grad_(true);
  at::Tensor y_plain = plain.body(x_plain * 1.0);
  (y_plain.sum() + y_plain.sum()).backward();
  EXPECT_TRUE(at::equal(x.grad(), x_plain.grad()));
  EXPECT_TRUE(at::equal(layer.w.grad(), plain.w.grad()));
}

// Of two live calls of one checkpoint, the newest is the one whose forward finished last; its
// tensors are those its report lists, in its order, each at the address the report gives.
TEST(Residency, TheNewestLiveCheckpointHandsOverTheTensorsItsReportLists) {
  ResidualLayer layer;
  auto x = at::rand({4, 8}).requires_grad_(true);
  const auto body = [&](const at::Tensor& in) { return layer.body(in); };
  at::Tensor first = remat::checkpoint({.region_name = "layer"})(body)(x);
  const at::Tensor second_input = first * 2.0;
  at::Tensor second = remat::checkpoint({.region_name = "layer"})(body)(second_input);
  const std::optional<remat::KeptTensors> newest = remat::newest_live_checkpoint("layer");
  ASSERT_TRUE(newest.has_value());
  EXPECT_FALSE(remat::newest_live_checkpoint("another").has_value());
  std::vector<std::uintptr_t> listed;
  for (const remat::RegionResidency& region : newest->report.regions) {
    for (const remat::ResidentTensor& t : region.tensors) listed.push_back(t.address);
  }
  std::vector<std::uintptr_t> handed;
  for (const at::Tensor& t : newest->tensors) handed.push_back(reinterpret_cast<std::uintptr_t>(t.storage().data()));
  EXPECT_EQ(handed, listed);
  // The second call's input (its first norm saves it) is there; the first call's is not
  const auto count = [&](const at::Tensor& t) {
    return std::count(handed.begin(), handed.end(), reinterpret_cast<std::uintptr_t>(t.storage().data()));
  };
  EXPECT_GE(count(second_input), 1);
  EXPECT_EQ(count(x), 0);
  EXPECT_EQ(remat::live_checkpoint_reports().size(), 2U);
  second.sum().backward();
}

// The kept sum is what autograd saved: changed in place after the norm saved it, backward refuses
// it, as autograd would.
TEST(Residency, TheKeptResidualSumChangedInPlaceAfterItsSaveIsRefused) {
  auto x = at::rand({4, 8}).requires_grad_(true);
  at::Tensor y = remat::checkpoint({.region_name = "changed"})([](const at::Tensor& in) {
    at::Tensor r = in * 2.0;
    at::Tensor m = remat::region(ResidualLayer::rms, "post_norm", /*recompute=*/false)(r);
    r.mul_(3.0);
    return m;
  })(x);
  const std::string message = error_of([&] { y.sum().backward(); });
  EXPECT_NE(message.find("of region 'changed::post_norm' was modified in-place after it was saved"), std::string::npos)
      << message;
}

// Where recompute runs anyway (attention recomputed), the sum is made again, not kept; attention's
// output, which the add reads before the sum is made, is made again too.
TEST(Residency, WhereRecomputeRunsAnywayTheResidualSumIsMadeAgainNotKept) {
  ResidualLayer layer;
  layer.attention_saves = false;
  const at::Tensor x0 = at::rand({4, 8});
  auto x = x0.clone().requires_grad_(true);
  at::Tensor y = remat::checkpoint({.region_name = "layer"})([&](const at::Tensor& in) { return layer.body(in); })(x);
  const std::vector<remat::MemoryReport> reports = remat::live_checkpoint_reports();
  ASSERT_EQ(reports.size(), 1U);
  // x, the first norm's output (attention's input) and each norm's rsqrt; not the sum.
  EXPECT_EQ(reports[0].bytes, remat::testing::float_bytes(2 * 32 + 2 * 4));
  y.sum().backward();
  EXPECT_EQ(layer.recomputes, 1);
  EXPECT_EQ(layer.runs, (std::map<std::string, int>{{"attention", 2}, {"norm", 1}, {"post_norm", 1}}));

  ResidualLayer plain;
  plain.w = layer.w.detach().clone().requires_grad_(true);
  auto x_plain = x0.clone().requires_grad_(true);
  plain.body(x_plain).sum().backward();
  EXPECT_TRUE(at::equal(x.grad(), x_plain.grad()));
  EXPECT_TRUE(at::equal(layer.w.grad(), plain.w.grad()));
}

// Recompute runs up to the last tensor it makes, a ferried one included: a save region's output
// that code before that point reads (the add of attention's output, after the only dropped tensor)
// is kept, not handed to recompute as a placeholder.
TEST(Residency, AnOutputReadBeforeTheLastFerriedTensorIsKeptForRecompute) {
  at::Tensor w = at::rand({8, 8}).requires_grad_(true);
  auto body = [&w](const at::Tensor& in) {
    at::Tensor u = in.sin();  // saves in: dropped, recompute makes u again
    at::Tensor a = remat::region([&w](const at::Tensor& t) { return t.matmul(w); }, "attention", false)(u);
    at::Tensor r = u + a;
    return remat::region(ResidualLayer::rms, "post_norm", /*recompute=*/false)(r);
  };
  const at::Tensor x0 = at::rand({4, 8});
  auto x = x0.clone().requires_grad_(true);
  remat::checkpoint({.region_name = "read"})(body)(x).sum().backward();
  at::Tensor w_grad = w.grad().clone();
  w.mutable_grad() = at::Tensor();
  auto x_plain = x0.clone().requires_grad_(true);
  body(x_plain).sum().backward();
  EXPECT_TRUE(at::equal(x.grad(), x_plain.grad()));
  EXPECT_TRUE(at::equal(w_grad, w.grad()));
}
