#pragma once
// Point-to-point tensor transfers between pipeline ranks through PyTorch's c10d (Gloo for CPU
// tensors, NCCL for CUDA tensors on builds that have it), with the rendezvous PyTorch jobs use:
// RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT from the launcher.

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace at {
class Tensor;
}

namespace remat::pipeline {

struct LaunchEnvironment {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  // A listening socket the launcher opened for rank 0's store (REMAT_MASTER_LISTEN_FD), so that
  // no other process can take the port between choosing and binding it.
  std::optional<int> master_listen_fd;
  // The launcher already runs the store (torchrun: TORCHELASTIC_USE_AGENT_STORE=True), so rank
  // 0 connects to it instead of serving one.
  bool agent_store = false;
};

// Reads the launcher's variables. Throws RuntimeError naming a variable that is missing or not
// a number in range, and how to start the job instead (remat-launch, torchrun).
LaunchEnvironment read_launch_environment();

enum class CommBackend { gloo, nccl };

struct CommunicatorOptions {
  CommBackend backend = CommBackend::gloo;
  // Rendezvous and every transfer: a rank that is gone makes the others fail within this.
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
};

// A send or receive in flight. wait() returns when it completed and throws RuntimeError (naming
// the peer and what failed) when the transfer failed or timed out.
class Transfer {
 public:
  struct State;
  Transfer() = default;
  explicit Transfer(std::shared_ptr<State> state) : state_(std::move(state)) {}
  void wait();
  bool pending() const { return state_ != nullptr; }

 private:
  std::shared_ptr<State> state_;
};

class Communicator {
 public:
  // Joins the job: rank 0 serves the store (unless agent_store; on the loopback address alone
  // when MASTER_ADDR is one), every rank connects to it and builds the process group. Throws
  // RuntimeError for a MASTER_ADDR that does not resolve, a port in use, a store that cannot be
  // reached within the timeout, or a backend this build lacks.
  static std::shared_ptr<Communicator> connect(const LaunchEnvironment& environment,
                                               const CommunicatorOptions& options = {});
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const;
  int world_size() const;
  CommBackend backend() const;

  // `tensor` must stay alive and unchanged (send) or untouched (receive) until wait() returns.
  // Transfers between one pair of ranks are matched by `tag`, and a receive must have the byte
  // size of its send: Gloo ends the process when a message is larger than the receiving tensor
  // (on its own thread, where no caller can catch it) and leaves the rest of a larger receive
  // unwritten. PipelineRuntime has every rank agree on shapes and schedule before its first
  // transfer (agree_across_ranks).
  Transfer send(const at::Tensor& tensor, int peer, int tag);
  Transfer receive(const at::Tensor& tensor, int peer, int tag);
  // Every rank reaches this point.
  void barrier();
  // Every rank's `value`, indexed by rank, through the rendezvous store (no transfer on the
  // process group, so values of any size and content are safe). Every rank calls it in the same
  // order; `what` names the exchange in the error thrown when a rank does not take part within
  // the timeout.
  std::vector<std::string> gather_from_all(const std::string& what, const std::string& value);

 private:
  struct Impl;
  explicit Communicator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace remat::pipeline
