#include <remat/pipeline/communicator.hpp>
#include <remat/pipeline/errors.hpp>

#include "runtime/nccl_backend.hpp"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string_view>
#include <utility>
#include <vector>

namespace remat::pipeline {
namespace {

constexpr std::string_view kHowToLaunch =
    "start the job with remat-launch --nproc N -- PROGRAM (one machine) or torchrun, which set "
    "RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT";

std::optional<std::string> environment_value(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

int environment_int(const char* name, int min, int max, std::optional<int> fallback) {
  const auto text = environment_value(name);
  if (!text) {
    if (fallback) return *fallback;
    throw RuntimeError(std::string(name) + " is not set; " + std::string(kHowToLaunch));
  }
  int value = 0;
  const char* end = text->data() + text->size();
  const auto [ptr, error] = std::from_chars(text->data(), end, value);
  if (error != std::errc() || ptr != end || value < min || value > max) {
    throw RuntimeError(std::string(name) + "='" + text->substr(0, 64) + "' is not a whole number in " +
                       std::to_string(min) + ".." + std::to_string(max) + "; " + std::string(kHowToLaunch));
  }
  return value;
}

// c10's errors carry a C++ backtrace in what(); a user needs the message.
std::string message_of(const std::exception& error) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&error)) return c10_error->what_without_backtrace();
  return error.what();
}

bool is_loopback(const std::string& address) {
  return address == "localhost" || address.rfind("127.", 0) == 0 || address == "::1";
}

bool is_loopback(const addrinfo& address) {
  if (address.ai_family == AF_INET) {
    return (ntohl(reinterpret_cast<const sockaddr_in*>(address.ai_addr)->sin_addr.s_addr) >> 24) == 127;
  }
  return address.ai_family == AF_INET6 &&
         IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(address.ai_addr)->sin6_addr);
}

struct Addresses {
  addrinfo* first = nullptr;
  Addresses() = default;
  Addresses(const Addresses&) = delete;
  Addresses& operator=(const Addresses&) = delete;
  ~Addresses() {
    if (first != nullptr) ::freeaddrinfo(first);
  }
};

// Resolved before anything waits on it: a name that does not resolve would otherwise cost the
// whole timeout in connection retries and end in a message about timing out.
void resolve_master(const LaunchEnvironment& environment, Addresses& addresses) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  const std::string port = std::to_string(environment.master_port);
  const int error = ::getaddrinfo(environment.master_addr.c_str(), port.c_str(), &hints, &addresses.first);
  if (error != 0) {
    throw RuntimeError("rank " + std::to_string(environment.rank) + ": MASTER_ADDR='" +
                       environment.master_addr.substr(0, 256) + "' does not resolve (" + ::gai_strerror(error) +
                       "); give the host name or address of rank 0's machine (127.0.0.1 when every rank runs on "
                       "this one)");
  }
}

// The store's server listens on every interface unless it is handed a socket. When MASTER_ADDR
// is a loopback address no other machine takes part, so the store gets a socket bound to that
// address alone and stays unreachable from the network.
int listen_on(const addrinfo& address, const std::string& where) {
  const int fd = ::socket(address.ai_family, address.ai_socktype | SOCK_CLOEXEC, address.ai_protocol);
  const int one = 1;
  if (fd < 0 || ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
      ::bind(fd, address.ai_addr, address.ai_addrlen) != 0 || ::listen(fd, SOMAXCONN) != 0) {
    const int error = errno;
    if (fd >= 0) ::close(fd);
    throw RuntimeError("rank 0 could not serve the rendezvous store on " + where + ": " + std::strerror(error) +
                       (error == EADDRINUSE ? "; the port is in use: pick another MASTER_PORT (remat-launch picks a "
                                              "free one)"
                                            : ""));
  }
  return fd;
}

}  // namespace

LaunchEnvironment read_launch_environment() {
  LaunchEnvironment environment;
  environment.world_size = environment_int("WORLD_SIZE", 1, 1 << 20, std::nullopt);
  environment.rank = environment_int("RANK", 0, environment.world_size - 1, std::nullopt);
  environment.local_rank = environment_int("LOCAL_RANK", 0, 1 << 20, environment.rank);
  environment.master_addr = environment_value("MASTER_ADDR").value_or("127.0.0.1");
  if (environment.master_addr.empty()) throw RuntimeError("MASTER_ADDR is empty; " + std::string(kHowToLaunch));
  environment.master_port = environment_int("MASTER_PORT", 1, 65535, std::nullopt);
  if (environment_value("REMAT_MASTER_LISTEN_FD") && environment.rank == 0) {
    environment.master_listen_fd =
        environment_int("REMAT_MASTER_LISTEN_FD", 0, std::numeric_limits<int>::max(), std::nullopt);
  }
  environment.agent_store = environment_value("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
  return environment;
}

struct Transfer::State {
  c10::intrusive_ptr<c10d::Work> work;
  at::Tensor tensor;  // kept alive until the transfer completes
  std::string what;   // "receive from rank 2 (tag 17)"
  std::chrono::milliseconds timeout;
};

void Transfer::wait() {
  if (!state_) return;
  const auto state = std::move(state_);
  try {
    state->work->wait(state->timeout);
  } catch (const std::exception& e) {
    throw RuntimeError(state->what + " failed: " + message_of(e) +
                       " (the peer rank exited, failed or did not reach this transfer within " +
                       std::to_string(state->timeout.count()) + " ms; see its output)");
  }
}

struct Communicator::Impl {
  LaunchEnvironment environment;
  CommunicatorOptions options;
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> backend;
  bool serves_store = false;  // the store lives in this process and ends with it
  int gathers = 0;            // gather_from_all calls so far: each call's keys are its own
};

Communicator::Communicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Communicator::~Communicator() = default;

std::shared_ptr<Communicator> Communicator::connect(const LaunchEnvironment& environment,
                                                    const CommunicatorOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->environment = environment;
  impl->options = options;
  const std::string where = environment.master_addr + ":" + std::to_string(environment.master_port);
  Addresses addresses;
  resolve_master(environment, addresses);

  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<std::uint16_t>(environment.master_port);
  store_options.isServer = environment.rank == 0 && !environment.agent_store;
  impl->serves_store = store_options.isServer;
  store_options.numWorkers = environment.world_size;
  store_options.timeout = options.timeout;
  if (store_options.isServer && environment.master_listen_fd) {
    store_options.masterListenFd = environment.master_listen_fd;
  } else if (store_options.isServer && is_loopback(*addresses.first)) {
    store_options.masterListenFd = listen_on(*addresses.first, where);
  }
  try {
    impl->store = c10::make_intrusive<c10d::TCPStore>(environment.master_addr, store_options);
  } catch (const std::exception& e) {
    throw RuntimeError(
        "rank " + std::to_string(environment.rank) +
        (store_options.isServer ? " could not serve the rendezvous store on " : " could not reach the rendezvous store at ") +
        where + ": " + message_of(e) + "; if the port is in use pick another MASTER_PORT (remat-launch picks a free one), and " +
        "check that all WORLD_SIZE=" + std::to_string(environment.world_size) + " ranks start within " +
        std::to_string(options.timeout.count()) + " ms");
  }

  try {
    if (options.backend == CommBackend::nccl) {
      impl->backend = detail::make_nccl_backend(impl->store, environment.rank, environment.world_size, options.timeout);
    } else {
      auto gloo_options = c10d::ProcessGroupGloo::Options::create(options.timeout);
      if (const auto interface = environment_value("GLOO_SOCKET_IFNAME")) {
        gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(*interface));
      } else if (is_loopback(environment.master_addr)) {
        gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
      } else {
        gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
      }
      impl->backend = c10::make_intrusive<c10d::ProcessGroupGloo>(impl->store, environment.rank,
                                                                 environment.world_size, gloo_options);
    }
  } catch (const RuntimeError&) {
    throw;
  } catch (const std::exception& e) {
    throw RuntimeError("rank " + std::to_string(environment.rank) + " could not join the process group of " +
                       std::to_string(environment.world_size) + " ranks through " + where + ": " + message_of(e) +
                       "; check that WORLD_SIZE matches the number of ranks started, and the other ranks' output "
                       "for one that failed before joining");
  }
  return std::shared_ptr<Communicator>(new Communicator(std::move(impl)));
}

int Communicator::rank() const { return impl_->environment.rank; }
int Communicator::world_size() const { return impl_->environment.world_size; }
CommBackend Communicator::backend() const { return impl_->options.backend; }

namespace {

Transfer start_transfer(c10d::Backend& backend, bool sending, const at::Tensor& tensor, int peer, int tag,
                        std::chrono::milliseconds timeout) {
  auto state = std::make_shared<Transfer::State>();
  state->tensor = tensor;
  state->timeout = timeout;
  state->what = std::string(sending ? "send to rank " : "receive from rank ") + std::to_string(peer) + " (tag " +
                std::to_string(tag) + ")";
  std::vector<at::Tensor> tensors{tensor};
  try {
    state->work = sending ? backend.send(tensors, peer, tag) : backend.recv(tensors, peer, tag);
  } catch (const std::exception& e) {
    throw RuntimeError(state->what + " could not start: " + message_of(e));
  }
  return Transfer(std::move(state));
}

}  // namespace

Transfer Communicator::send(const at::Tensor& tensor, int peer, int tag) {
  return start_transfer(*impl_->backend, true, tensor, peer, tag, impl_->options.timeout);
}

Transfer Communicator::receive(const at::Tensor& tensor, int peer, int tag) {
  return start_transfer(*impl_->backend, false, tensor, peer, tag, impl_->options.timeout);
}

void Communicator::barrier() {
  try {
    impl_->backend->barrier()->wait(impl_->options.timeout);
  } catch (const std::exception& e) {
    throw RuntimeError("rank " + std::to_string(rank()) + ": barrier failed: " + message_of(e) +
                       " (another rank exited or failed; see its output)");
  }
}

std::vector<std::string> Communicator::gather_from_all(const std::string& what, const std::string& value) {
  const std::string prefix = "remat/gather/" + std::to_string(impl_->gathers++) + "/";
  const auto key = [&](int r) { return prefix + std::to_string(r); };
  try {
    impl_->store->set(key(rank()), std::vector<std::uint8_t>(value.begin(), value.end()));
  } catch (const std::exception& e) {
    throw RuntimeError("rank " + std::to_string(rank()) + " could not publish its " + what +
                       " in the rendezvous store: " + message_of(e) + " (rank 0, which serves it, exited or failed; "
                       "see its output)");
  }
  std::vector<std::string> values(static_cast<std::size_t>(world_size()));
  for (int r = 0; r < world_size(); ++r) {
    try {
      impl_->store->wait({key(r)}, impl_->options.timeout);
      const std::vector<std::uint8_t> bytes = impl_->store->get(key(r));
      values[static_cast<std::size_t>(r)].assign(bytes.begin(), bytes.end());
    } catch (const std::exception& e) {
      throw RuntimeError("rank " + std::to_string(rank()) + ": rank " + std::to_string(r) + " did not share its " +
                         what + " within " + std::to_string(impl_->options.timeout.count()) + " ms: " + message_of(e) +
                         " (it exited, failed or did not reach this point; see its output)");
    }
  }
  // The store ends with the process that serves it: that rank returns (and may fail on what it
  // read, and exit) only once every rank has read every value.
  try {
    impl_->store->set(prefix + "read/" + std::to_string(rank()), std::vector<std::uint8_t>{1});
    if (impl_->serves_store) {
      for (int r = 0; r < world_size(); ++r) {
        impl_->store->wait({prefix + "read/" + std::to_string(r)}, impl_->options.timeout);
      }
    }
  } catch (const std::exception& e) {
    throw RuntimeError("rank " + std::to_string(rank()) + ": a rank did not read every rank's " + what + " within " +
                       std::to_string(impl_->options.timeout.count()) + " ms: " + message_of(e) +
                       " (it exited or failed; see its output)");
  }
  return values;
}

}  // namespace remat::pipeline
