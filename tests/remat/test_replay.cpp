// Record and replay of forward decisions across recompute, and verify_recompute.

#include "support.hpp"

#include <remat/replay.hpp>

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
