// Record and replay of forward decisions across recompute, and verify_recompute.

#include "support.hpp"

#include <remat/budget/plan.hpp>
#include <remat/replay.hpp>

#include <functional>

#include <thread>

namespace {

using Recorder = remat::RecomputeReplayRecorder<int>;

TEST(Recorder, ReplaysInOrderThenCountsMisses) {
  remat::RecomputeReplay<int> channel("decisions");
  auto recorder = std::make_shared<Recorder>();
  recorder->record(4);
  recorder->record(7);
  EXPECT_EQ(recorder->size(), 2u);
  auto replay = channel.scope(recorder, "replay");
  EXPECT_EQ(recorder->take(), 4);
  EXPECT_EQ(recorder->take(), 7);
  EXPECT_EQ(recorder->take(), std::nullopt);
  EXPECT_EQ(recorder->replay_misses(), 1u);
  recorder->rewind();
  EXPECT_EQ(recorder->take(), 4);
  EXPECT_EQ(recorder->records(), (std::vector<int>{4, 7}));
}

// NeMo's recorder is driven directly in its own tests and tools: take() needs no scope.
TEST(Recorder, TakeOutsideAnyScopeReturnsTheNextRecordThenNothing) {
  auto recorder = std::make_shared<Recorder>();
  recorder->record(4);
  EXPECT_EQ(recorder->take(), 4);
  EXPECT_EQ(recorder->take(), std::nullopt);
  EXPECT_EQ(recorder->replay_misses(), 1u);
  recorder->rewind();
  EXPECT_EQ(recorder->take(), 4);
}

TEST(Recorder, SecondCheckpointCallRecordingIntoOneRecorderIsRefused) {
  remat::RecomputeReplay<int> channel("router");
  auto shared = std::make_shared<Recorder>();
  { auto first_forward = channel.scope(shared, "record"); }
  try {
    auto second_forward = channel.scope(shared, "record");
    FAIL() << "a second forward recorded into a used recorder";
  } catch (const remat::Error& e) {
    EXPECT_NE(std::string(e.what()).find("another checkpoint call"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(channel.current().has_value());  // the refused scope bound nothing
  { auto replay = channel.scope(shared, "replay"); }  // the first call's recompute still replays
}

TEST(Channel, ScopesBindNestAndRestore) {
  remat::RecomputeReplay<int> channel("decisions");
  EXPECT_FALSE(channel.current().has_value());
  auto outer_recorder = std::make_shared<Recorder>();
  auto inner_recorder = std::make_shared<Recorder>();
  {
    auto outer = channel.scope(outer_recorder, "record");
    EXPECT_EQ(channel.current()->mode, remat::ReplayMode::record);
    {
      auto inner = channel.scope(inner_recorder, "replay");
      EXPECT_EQ(channel.current()->recorder, inner_recorder);
      EXPECT_EQ(channel.current()->mode, remat::ReplayMode::replay);
      {
        auto disabled = channel.scope(nullptr, "record");
        EXPECT_FALSE(channel.current().has_value());
        EXPECT_EQ(channel.record_or_replay([] { return 5; }), 5);
      }
    }
    EXPECT_EQ(channel.current()->recorder, outer_recorder);
  }
  EXPECT_FALSE(channel.current().has_value());
  EXPECT_EQ(inner_recorder->size(), 0u);
}

TEST(Channel, BadModeIsAClearError) {
  remat::RecomputeReplay<int> channel("decisions");
  try {
    auto scope = channel.scope(std::make_shared<Recorder>(), "rewind");
    FAIL();
  } catch (const remat::Error& e) {
    EXPECT_NE(std::string(e.what()).find("mode 'rewind' is not valid"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(channel.current().has_value());
}

TEST(Channel, ThreadsHaveTheirOwnBindingsAndChannelsAreIndependent) {
  remat::RecomputeReplay<int> a("a");
  remat::RecomputeReplay<int> b("b");
  auto recorder = std::make_shared<Recorder>();
  auto scope = a.scope(recorder, "record");
  EXPECT_FALSE(b.current().has_value());
  bool seen_in_thread = true;
  std::thread([&] {
    seen_in_thread = a.current().has_value();
    auto own = a.scope(std::make_shared<Recorder>(), "replay");
    EXPECT_EQ(a.current()->mode, remat::ReplayMode::replay);
  }).join();
  EXPECT_FALSE(seen_in_thread);
  EXPECT_EQ(a.current()->mode, remat::ReplayMode::record);
}

TEST(Channel, RecordThenReplayAndFallBackOnAMiss) {
  remat::RecomputeReplay<int> channel("decisions");
  auto recorder = std::make_shared<Recorder>();
  int computed = 0;
  auto compute = [&] { return ++computed * 10; };
  {
    auto scope = channel.scope(recorder, "record");
    EXPECT_EQ(channel.record_or_replay(compute), 10);
  }
  auto scope = channel.scope(recorder, "replay");
  EXPECT_EQ(channel.record_or_replay(compute), 10);  // taken, not computed
  EXPECT_EQ(channel.record_or_replay(compute), 20);  // the log ran out: computed
  EXPECT_EQ(computed, 2);
  EXPECT_EQ(recorder->replay_misses(), 1u);
}

class EventContext final : public remat::CheckpointContext {
 public:
  EventContext(std::string name, std::vector<std::string>& events) : name_(std::move(name)), events_(events) {}
  void enter_forward() override { events_.push_back(name_ + " forward enter"); }
  void exit_forward() override { events_.push_back(name_ + " forward exit"); }
  void enter_recompute() override { events_.push_back(name_ + " recompute enter"); }
  void exit_recompute() override { events_.push_back(name_ + " recompute exit"); }

 private:
  std::string name_;
  std::vector<std::string>& events_;
};

TEST(Contexts, EnterInOrderExitInReverseAroundForwardAndRecompute) {
  std::vector<std::string> events;
  auto factory = [&](std::string name) -> remat::CheckpointContextFactory {
    return [&events, name] { return std::make_unique<EventContext>(name, events); };
  };
  auto x = at::rand({4}).requires_grad_(true);
  auto loss = remat::checkpoint({.region_name = "ctx", .contexts = {factory("A"), factory("B")}})(
      [&](const at::Tensor& in) {
        events.push_back(remat::is_recomputing() ? "body recompute" : "body forward");
        return in.exp().sum();
      })(x);
  loss.backward();
  EXPECT_EQ(events, (std::vector<std::string>{"A forward enter", "B forward enter", "body forward", "B forward exit",
                                              "A forward exit", "A recompute enter", "B recompute enter",
                                              "body recompute", "B recompute exit", "A recompute exit"}));
}

// A frozen router: the top-k choice is a decision recompute can take back.
struct Router {
  at::Tensor router_weight;  // frozen
  at::Tensor experts;        // [E, D, D], trained
  remat::RecomputeReplay<at::Tensor>* channel = nullptr;
  int topk_calls = 0;
  static constexpr std::int64_t kTop = 2;

  at::Tensor forward(const at::Tensor& x) {
    auto logits = at::matmul(x, router_weight.t());
    auto compute = [&] {
      ++topk_calls;
      return std::get<1>(logits.topk(kTop, -1));
    };
    at::Tensor indices;
    if (channel != nullptr) {
      indices = channel->record_or_replay(compute);
    } else {
      at::NoGradGuard no_grad;  // the same decision, made the same way, without a channel
      indices = compute();
    }
    auto gates = at::softmax(logits.gather(-1, indices), -1);             // [T, k]
    auto chosen = experts.index_select(0, indices.flatten()).view({x.size(0), kTop, x.size(1), x.size(1)});
    auto outputs = at::matmul(x.unsqueeze(1).unsqueeze(2), chosen).squeeze(2);  // [T, k, D]
    return (outputs * gates.unsqueeze(-1)).sum(1);
  }
};

std::pair<at::Tensor, at::Tensor> router_grads(Router& router, const at::Tensor& x_in, bool checkpointed,
                                               const std::vector<remat::CheckpointContextFactory>& contexts) {
  auto x = x_in.detach().clone().requires_grad_(true);
  router.experts.mutable_grad() = at::Tensor();
  at::Tensor out = checkpointed ? remat::checkpoint({.region_name = "moe", .contexts = contexts})(
                                      [&](const at::Tensor& in) { return router.forward(in).tanh(); })(x)
                                : router.forward(x).tanh();
  out.pow(2).sum().backward();
  return {x.grad().clone(), router.experts.grad().clone()};
}

TEST(FrozenRouter, TopKRunsOncePerCallInForwardAndNeverInRecompute) {
  at::manual_seed(3);
  Router router{at::randn({8, 16}), (at::randn({8, 16, 16}) * 0.1).requires_grad_(true)};
  remat::RecomputeReplay<at::Tensor> channel("router.topk");
  const auto x = at::randn({32, 16});

  const auto reference = router_grads(router, x, /*checkpointed=*/false, {});
  const auto recomputed = router_grads(router, x, /*checkpointed=*/true, {});
  router.channel = &channel;
  std::size_t recorded = 0;
  router.topk_calls = 0;
  const auto replayed = router_grads(router, x, /*checkpointed=*/true,
                                     {channel.context_factory([&](auto& recorder) { recorded = recorder.size(); })});
  EXPECT_EQ(router.topk_calls, 1);  // forward only
  EXPECT_EQ(recorded, 1u);          // on_record_exit saw the forward's log
  EXPECT_TRUE(at::equal(replayed.first, reference.first));
  EXPECT_TRUE(at::equal(replayed.second, reference.second));
  EXPECT_TRUE(at::equal(recomputed.second, reference.second));
}

TEST(FrozenRouter, EachCallGetsItsOwnRecorderEvenWithTwoMicrobatchesInFlight) {
  at::manual_seed(4);
  remat::RecomputeReplay<at::Tensor> channel("router.topk");
  std::vector<at::Tensor> forward_choice, recompute_choice;
  auto block = remat::checkpoint({.region_name = "moe", .contexts = {channel.context_factory()}})(
      [&](const at::Tensor& in) {
        auto choice = channel.record_or_replay([&] { return std::get<1>(in.topk(1, -1)); });
        (remat::is_recomputing() ? recompute_choice : forward_choice).push_back(choice);
        return (in * 2.0).exp().sum();
      });
  auto x1 = at::randn({4, 6}).requires_grad_(true);
  auto x2 = at::randn({4, 6}).requires_grad_(true);
  auto loss1 = block(x1);
  auto loss2 = block(x2);  // both microbatches in flight
  loss2.backward();        // recompute of call 2 first
  loss1.backward();
  ASSERT_EQ(forward_choice.size(), 2u);
  ASSERT_EQ(recompute_choice.size(), 2u);
  EXPECT_TRUE(at::equal(recompute_choice[0], forward_choice[1]));
  EXPECT_TRUE(at::equal(recompute_choice[1], forward_choice[0]));
}

// Routed layers that record their top-k into one channel, in several regions of one checkpoint.
// Recompute skips a save region, so the decision it recorded is never asked for: the recomputed
// region after it must take back its own decision, not the skipped one's.
struct RoutedLayers {
  std::vector<at::Tensor> weights;  // trained
  remat::RecomputeReplay<at::Tensor>* channel = nullptr;
  std::vector<at::Tensor> decided;  // every decision computed (none taken back)

  static RoutedLayers make(std::size_t layers) {
    at::manual_seed(11);
    RoutedLayers out;
    for (std::size_t i = 0; i < layers; ++i) out.weights.push_back(at::rand({8, 8}).requires_grad_(true));
    return out;
  }
  at::Tensor layer(const at::Tensor& t, std::size_t i) {
    at::Tensor scores = at::matmul(t, weights[i]);
    auto compute = [&] {
      decided.push_back(std::get<1>(scores.topk(2, -1)));
      return decided.back();
    };
    at::Tensor indices;
    if (channel != nullptr) {
      indices = channel->record_or_replay(compute);
    } else {
      at::NoGradGuard no_grad;
      indices = compute();
    }
    return scores.gather(-1, indices).repeat({1, 4});
  }
  std::function<at::Tensor(const at::Tensor&)> layer_fn(std::size_t i) {
    return [this, i](const at::Tensor& t) { return layer(t, i); };
  }
  std::vector<at::Tensor> grads(const at::Tensor& x) const {
    std::vector<at::Tensor> out{x.grad().clone()};
    for (const at::Tensor& w : weights) out.push_back(w.grad().clone());
    return out;
  }
  void zero_grads() {
    for (at::Tensor& w : weights) w.mutable_grad() = at::Tensor();
  }
};

// Runs `body` under a checkpoint with the channel (or plainly, for the reference) and returns
// the gradients of x and the weights after `backwards` backward passes.
std::vector<at::Tensor> routed_grads(RoutedLayers& layers, remat::RecomputeReplay<at::Tensor>* channel,
                                     const std::function<at::Tensor(const at::Tensor&)>& body,
                                     std::shared_ptr<const remat::budget::RegionChoices> plan = nullptr,
                                     int backwards = 1) {
  layers.zero_grads();
  layers.channel = channel;
  layers.decided.clear();
  at::manual_seed(12);
  auto x = at::rand({4, 8}).requires_grad_(true);
  at::Tensor y =
      channel == nullptr
          ? body(x)
          : remat::checkpoint({.region_name = "c", .contexts = {channel->context_factory()}, .plan = std::move(plan)})(
                body)(x);
  const at::Tensor loss = (y * at::arange(8, y.options())).sum();
  for (int i = 0; i < backwards; ++i) loss.backward({}, /*retain_graph=*/i + 1 < backwards);
  return layers.grads(x);
}

void expect_equal_grads(const std::vector<at::Tensor>& actual, const std::vector<at::Tensor>& expected,
                        const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size());
  for (std::size_t i = 0; i < actual.size(); ++i)
    EXPECT_TRUE(at::equal(actual[i], expected[i])) << what << ", gradient " << i;
}

TEST(ReplayWithSaveRegions, ARecomputedRegionTakesItsOwnDecisionAfterASavedOne) {
  RoutedLayers layers = RoutedLayers::make(2);
  remat::RecomputeReplay<at::Tensor> channel("router.topk");
  auto body = [&](bool first_recomputes) {
    return [&layers, first_recomputes](const at::Tensor& in) {
      auto h = remat::region(layers.layer_fn(0), "moe1", first_recomputes)(in);
      return remat::region(layers.layer_fn(1), "moe2")(h);
    };
  };
  const auto expected = routed_grads(layers, nullptr, body(true));
  ASSERT_EQ(layers.decided.size(), 2u);
  ASSERT_FALSE(at::equal(layers.decided[0], layers.decided[1]));  // a misplaced decision would show

  expect_equal_grads(routed_grads(layers, &channel, body(false)), expected, "moe1 saved by the code");
  EXPECT_EQ(layers.decided.size(), 2u);  // forward's two; recompute took moe2's back
  using remat::budget::Choice;
  const auto plan = std::make_shared<remat::budget::RegionChoices>(
      std::vector<std::pair<std::string, Choice>>{{"c::moe1", Choice::save}, {"c::moe2", Choice::recompute}});
  expect_equal_grads(routed_grads(layers, &channel, body(true), plan), expected, "moe1 saved by a plan");
  EXPECT_EQ(layers.decided.size(), 2u);
  expect_equal_grads(
      routed_grads(layers, &channel, body(false), nullptr, /*backwards=*/2),
      [&] {
        auto twice = expected;
        for (auto& g : twice) g = g * 2;
        return twice;
      }(),
      "a second backward recomputes again");
  EXPECT_EQ(layers.decided.size(), 2u);
}

TEST(ReplayWithSaveRegions, ASaveRegionNestedInARecomputedOneKeepsTheOuterDecisionsInOrder) {
  RoutedLayers layers = RoutedLayers::make(3);
  remat::RecomputeReplay<at::Tensor> channel("router.topk");
  auto body = [&](const at::Tensor& in) {
    return remat::region(
        [&](const at::Tensor& t) {
          auto a = layers.layer(t, 0);
          auto b = remat::region(layers.layer_fn(1), "inner", /*recompute=*/false)(a);
          return layers.layer(b, 2);  // the outer region's second decision, after the skipped one
        },
        "outer")(in);
  };
  const auto expected = routed_grads(layers, nullptr, body);
  ASSERT_EQ(layers.decided.size(), 3u);
  ASSERT_FALSE(at::equal(layers.decided[1], layers.decided[2]));
  expect_equal_grads(routed_grads(layers, &channel, body), expected, "inner saved");
  EXPECT_EQ(layers.decided.size(), 3u);
}

TEST(ReplayWithSaveRegions, DecisionsOutsideRegionsStayInOrderAroundASkippedRegion) {
  RoutedLayers layers = RoutedLayers::make(3);
  remat::RecomputeReplay<at::Tensor> channel("router.topk");
  auto body = [&](const at::Tensor& in) {
    auto a = layers.layer(in, 0);  // in the checkpoint's body, outside regions
    auto b = remat::region(layers.layer_fn(1), "saved", /*recompute=*/false)(a);
    return layers.layer(b, 2);
  };
  const auto expected = routed_grads(layers, nullptr, body);
  expect_equal_grads(routed_grads(layers, &channel, body), expected, "between regions");
  EXPECT_EQ(layers.decided.size(), 3u);
}

at::Tensor noisy_block(const at::Tensor& in) {
  return remat::region([](const at::Tensor& t) { return (t + at::rand_like(t)).exp(); }, "noisy")(in).sum();
}

TEST(VerifyRecompute, CatchesANonDeterministicRegion) {
  auto x = at::rand({16}).requires_grad_(true);
  auto loss = remat::checkpoint({.region_name = "verify", .verify_recompute = true})(noisy_block)(x);
  try {
    loss.backward();
    FAIL() << "a non-deterministic region must be caught";
  } catch (const std::exception& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("region 'verify::noisy'"), std::string::npos) << message;
    EXPECT_NE(message.find("saved tensor #0"), std::string::npos) << message;
    EXPECT_NE(message.find("difference"), std::string::npos) << message;
  }
}

TEST(VerifyRecompute, PassesWithTheStateHook) {
  auto x = at::rand({16}).requires_grad_(true);
  auto loss = remat::checkpoint({.region_name = "verify-hooked",
                                 .recompute_state_hooks = {remat::cpu_rng_state_hook()},
                                 .verify_recompute = true})(noisy_block)(x);
  EXPECT_NO_THROW(loss.backward());
}

}  // namespace
