// remat::CpuOffload: the payloads, the host pool they copy into, the copy stream and the
// prefetch by checkpoint. Every access to a host buffer runs on the one copy stream of its
// device (CUDA), so a buffer that goes back to the pool is reused only after the copies that
// read or wrote it: stream order, no host waits.

#include <remat/cpu_allocator.hpp>
#include <remat/cpu_offload.hpp>
#include <remat/errors.hpp>

#include <remat/alloc/allocator.hpp>
#include <remat/alloc/cuda_backend.hpp>
#include <remat/alloc/tags.hpp>

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/Event.h>
#include <c10/core/Storage.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <chrono>
#include <deque>
#include <mutex>
#include <vector>

namespace remat {

namespace {

using Clock = std::chrono::steady_clock;

// Copies to the host on a copy stream, oldest first, each holding its device tensor until it has
// been read; stats.inflight_bytes is what they hold.
class CopiesToHost {
 public:
  void push(c10::Event done, at::Tensor device, std::uint64_t bytes, CpuOffloadStats& stats) {
    queue_.push_back({std::move(done), std::move(device), bytes});
    stats.inflight_bytes += bytes;
  }

  // Lets go of the device tensors whose copy is done; waits for the oldest while more than
  // `limit` bytes are held, counting the wait in stats.
  void settle(std::uint64_t limit, CpuOffloadStats& stats) {
    while (!queue_.empty()) {
      Copy& oldest = queue_.front();
      if (!oldest.done.query()) {
        if (stats.inflight_bytes <= limit) return;
        const auto start = Clock::now();
        oldest.done.synchronize();
        stats.wait_seconds += std::chrono::duration<double>(Clock::now() - start).count();
        stats.wait_bytes += oldest.bytes;
      }
      stats.inflight_bytes -= oldest.bytes;
      queue_.pop_front();
    }
  }

 private:
  struct Copy {
    c10::Event done;
    at::Tensor device;
    std::uint64_t bytes;
  };
  std::deque<Copy> queue_;
};

// One tensor's copy in host memory, shared by every payload of that tensor (a tensor saved by
// three ops, as the input of q, k and v projections is, is copied once).
struct HostCopy {
  std::weak_ptr<CpuOffload::HostCopies> owner;
  at::Tensor host;
  at::TensorOptions options;
  std::vector<std::int64_t> sizes, strides;
  std::uint64_t bytes = 0;
  std::uint64_t group = 0;
  std::uint64_t payloads = 0;  // that hold it
  std::uint64_t unpacked = 0;  // of those, unpacked at least once
  at::Tensor back;             // on the device again, for the payloads not unpacked yet
  std::optional<c10::Event> arrived;  // CUDA: the copy back is done (on the copy stream)
  ~HostCopy();
};

// A kept tensor as held: the tensor itself, or a share of its host copy.
struct Payload {
  std::weak_ptr<CpuOffload::HostCopies> owner;
  at::Tensor resident;
  std::shared_ptr<HostCopy> copy;
  bool unpacked = false;
  // The saved tensor's version counter and its version when packed. Autograd checks neither for
  // a tensor saved through hooks; unpack does, so that a change in place after the save is an
  // error as without the offloader, not a gradient from whichever value the copy read.
  c10::VariableVersion version{c10::VariableVersion::DISABLED};
  std::uint32_t version_at_pack = 0;
  ~Payload();
};

// What makes two saved tensors one: the same storage, view, version and the conjugate and
// negative bits (c and c.conj() share everything else, but hold other values).
struct TensorKey {
  const void* storage;
  std::int64_t offset;
  std::vector<std::int64_t> sizes, strides;
  c10::ScalarType dtype;
  std::uint32_t version;
  bool conjugate;
  bool negative;
  auto operator<=>(const TensorKey&) const = default;
};

bool is_parameter(const at::TensorBase& tensor) { return tensor.is_leaf() && tensor.requires_grad(); }


}  // namespace

struct CpuOffload::HostCopies : std::enable_shared_from_this<HostCopies> {
  explicit HostCopies(CpuOffloadOptions options_in)
      // The CUDA runtime's own count: LibTorch's CUDA guard can be registered, and report a
      // device, on a machine with none (once Inductor loaded its CUDA libraries).
      : options(options_in),
        device_type(alloc::cuda_device_available() && c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA)
                        ? c10::DeviceType::CUDA
                        : c10::DeviceType::CPU) {}

  CpuOffloadOptions options;
  c10::DeviceType device_type;  // what is offloaded from: CUDA where a GPU is visible, else CPU
  // Recursive: a payload dropped while the lock is held (its last owner a temporary of the
  // prefetch) tells its owner from its destructor.
  mutable std::recursive_mutex mutex;
  CpuOffloadStats stats;
  std::uint64_t live_payloads = 0;
  std::uint64_t group = 0;
  const void* last_checkpoint = nullptr;  // of the last pack offloaded
  std::map<std::uint64_t, std::vector<std::weak_ptr<HostCopy>>> groups;
  // This step's host copies by tensor; the storage's weak reference tells a live storage from a
  // new one at a freed one's address.
  std::map<TensorKey, std::pair<c10::weak_intrusive_ptr<c10::StorageImpl>, std::weak_ptr<HostCopy>>> copies;
  CopiesToHost to_host;  // CUDA: copies still reading their device tensors
  std::map<c10::DeviceIndex, c10::Stream> copy_streams;

  bool on_cuda() const { return device_type == c10::DeviceType::CUDA; }

  // Why `tensor` stays as it is, or nullptr when it is offloaded.
  const char* keep_reason(const at::Tensor& tensor) const {
    if (tensor.layout() != at::kStrided) return "sparse or another layout";
    if (tensor.is_nested()) return "nested";
    if (tensor.device().type() != device_type) return on_cuda() ? "not on a CUDA device" : "not on the CPU";
    if (!tensor.is_non_overlapping_and_dense()) return "overlapping or not dense";
    if (is_parameter(tensor) || (tensor.is_view() && is_parameter(tensor._base()))) return "a parameter or a view of one";
    if (tensor.numel() == 0) return "empty";
    if (tensor.nbytes() < options.min_bytes) return "under min_bytes";
    return nullptr;
  }

  c10::Stream copy_stream(c10::DeviceIndex device) {
    auto it = copy_streams.find(device);
    if (it == copy_streams.end()) {
      c10::impl::VirtualGuardImpl impl(device_type);
      it = copy_streams.emplace(device, impl.getStreamFromGlobalPool(c10::Device(device_type, device))).first;
    }
    return it->second;
  }

  c10::Stream current_stream(c10::DeviceIndex device) const {
    return c10::impl::VirtualGuardImpl(device_type).getStream(c10::Device(device_type, device));
  }

  // Callers hold the mutex.
  void settle_inflight(std::uint64_t limit) { to_host.settle(limit, stats); }

  // A new step: every payload of the last one is gone.
  void start_step() {
    const std::uint64_t resident = stats.resident_host_bytes, peak = stats.peak_host_bytes,
                        in_flight = stats.inflight_bytes;
    stats = CpuOffloadStats{};
    stats.resident_host_bytes = resident;
    stats.peak_host_bytes = peak;
    stats.inflight_bytes = in_flight;
    groups.clear();
    copies.clear();
    group = 0;
    last_checkpoint = nullptr;
  }

  // Which checkpoint a pack belongs to, numbered in forward order: a new one when the
  // checkpoint keeping the tensor changes; outside checkpoints each tensor stands alone.
  std::uint64_t group_of(const void* checkpoint) {
    if (checkpoint == nullptr || checkpoint != last_checkpoint) ++group;
    last_checkpoint = checkpoint;
    return group;
  }

  // A buffer of the pinned host pool, tagged with the region the tensor is kept for, phase
  // `offloaded`, and the tensor's own category and module (remat_alloc.track): what is kept for
  // backward stays the activation it is on the device, whatever category is in force at the pack.
  at::Tensor host_buffer(const at::Tensor& tensor, std::string_view region) {
    std::optional<alloc::TagScope> in_region;
    if (!region.empty()) {
      const std::string current = alloc::name_of(alloc::current_tag().region);
      const std::string_view rest = alloc::region_to_push(current, region);
      if (!rest.empty()) in_region.emplace(alloc::TagScope::region(rest));
    }
    std::optional<alloc::CategoryScope> as_the_tensor;
    if (const std::optional<alloc::Tag> source = category_of_kept(tensor)) {
      as_the_tensor.emplace(source->category, alloc::name_of(source->module));
    }
    auto offloaded = alloc::TagScope::phase(alloc::Phase::offloaded);
    c10::Storage storage(c10::Storage::use_byte_size_t(), tensor.nbytes(), offload_host_allocator(), false);
    return at::empty({0}, tensor.options().device(at::kCPU).requires_grad(false))
        .set_(storage, 0, tensor.sizes(), tensor.strides());
  }

  // The category and module a host copy of `tensor` takes: its storage's, where a remat allocator
  // made it and gave it one, an activation where tracking left it a temporary (or none) but a
  // category is in force (the copy is kept for backward, as track's pack hook would name it);
  // nullopt where it has none and none is in force (the copy keeps the category in force: none).
  static std::optional<alloc::Tag> category_of_kept(const at::Tensor& tensor) {
    const void* storage = tensor.storage().data();
    const std::optional<alloc::TagId> id = storage != nullptr ? alloc::find_block_tag(storage) : std::nullopt;
    alloc::Tag tag = id ? alloc::tag_of(*id) : alloc::Tag{};
    if (tag.category == alloc::Category::none || tag.category == alloc::Category::temporary) {
      if (!alloc::category_in_force()) return tag.category == alloc::Category::none ? std::nullopt : std::optional(tag);
      tag.category = alloc::Category::activation;
      if (tag.module == 0) tag.module = alloc::intern_name(alloc::current_category().second);
    }
    return tag;
  }

  std::any pack(const at::Tensor& tensor) {
    SavedTensorInfo info;  // called as PyTorch's own pack hook: a tensor saved for backward, not detached
    try {
      info = current_saved_tensor_info();
    } catch (const Error&) {
    }
    at::NoGradGuard no_grad;
    auto payload = std::make_shared<Payload>();
    payload->owner = weak_from_this();
    payload->version = tensor.unsafeGetTensorImpl()->version_counter();
    if (payload->version.enabled()) payload->version_at_pack = payload->version.current_version();
    std::lock_guard lock(mutex);
    if (live_payloads == 0) start_step();
    ++live_payloads;
    if (const char* reason = info.of_parameter ? "a parameter or a view of one" : keep_reason(tensor)) {
      payload->resident = tensor;
      stats.kept_resident_tensors += 1;
      stats.kept_resident_bytes += tensor.layout() == at::kStrided && !tensor.is_nested() ? tensor.nbytes() : 0;
      stats.kept_resident_reasons[reason] += 1;
      return payload;
    }
    const TensorKey key{tensor.storage().unsafeGetStorageImpl(),
                        tensor.storage_offset(),
                        tensor.sizes().vec(),
                        tensor.strides().vec(),
                        tensor.scalar_type(),
                        payload->version_at_pack,
                        tensor.is_conj(),
                        tensor.is_neg()};
    if (auto found = copies.find(key); found != copies.end() && !found->second.first.expired()) {
      if (std::shared_ptr<HostCopy> shared = found->second.second.lock()) {
        payload->copy = std::move(shared);
        payload->copy->payloads += 1;
        stats.shared_tensors += 1;
        return payload;
      }
    }
    auto copy = std::make_shared<HostCopy>();
    copy->owner = weak_from_this();
    copy->options = tensor.options();
    copy->sizes = tensor.sizes().vec();
    copy->strides = tensor.strides().vec();
    copy->bytes = tensor.nbytes();
    copy->group = group_of(info.checkpoint);
    copy->payloads = 1;
    copy->host = host_buffer(tensor, info.region);
    if (on_cuda()) {
      const std::uint64_t limit = options.max_inflight_bytes.value_or(UINT64_MAX);
      settle_inflight(limit > copy->bytes ? limit - copy->bytes : 0);  // room for this copy
      const c10::DeviceIndex device = tensor.device().index();
      const c10::Stream side = copy_stream(device);
      c10::Event produced(device_type);
      produced.record(current_stream(device));
      produced.block(side);
      {
        c10::StreamGuard on_side(side);
        copy->host.copy_(tensor, /*non_blocking=*/true);
      }
      c10::Event done(device_type);
      done.record(side);
      to_host.push(std::move(done), tensor, copy->bytes, stats);
    } else {
      copy->host.copy_(tensor);
    }
    stats.offloaded_bytes += copy->bytes;
    stats.offloaded_tensors += 1;
    stats.resident_host_bytes += copy->bytes;
    stats.peak_host_bytes = std::max(stats.peak_host_bytes, stats.resident_host_bytes);
    groups[copy->group].push_back(copy);
    copies.insert_or_assign(key, std::pair(tensor.storage().getWeakStorageImpl(), std::weak_ptr<HostCopy>(copy)));
    payload->copy = std::move(copy);
    return payload;
  }

  // Starts the copy of `copy` back to its device. Callers hold the mutex.
  at::Tensor bring_back(HostCopy& copy, bool ahead) {
    at::Tensor tensor = at::empty_strided(copy.sizes, copy.strides, copy.options);
    if (on_cuda()) {
      const c10::DeviceIndex device = copy.options.device().index();
      const c10::Stream side = copy_stream(device);
      // The new tensor's memory may have been freed by work still queued on the compute stream.
      c10::Event free_now(device_type);
      free_now.record(current_stream(device));
      free_now.block(side);
      {
        c10::StreamGuard on_side(side);
        tensor.copy_(copy.host, /*non_blocking=*/true);
      }
      copy.arrived.emplace(device_type);
      copy.arrived->record(side);
      if (!ahead) copy.arrived->block(current_stream(device));
    } else {
      tensor.copy_(copy.host);
    }
    return tensor;
  }

  // The tensors of the checkpoint `copy` belongs to and of the `prefetch` before it (backward
  // reaches them next), brought back now. Callers hold the mutex.
  void prefetch_around(const HostCopy& copy) {
    const std::uint64_t first = copy.group > options.prefetch ? copy.group - options.prefetch : 0;
    for (auto it = groups.lower_bound(first); it != groups.end() && it->first <= copy.group;) {
      bool any_alive = false;
      for (const std::weak_ptr<HostCopy>& weak : it->second) {
        const std::shared_ptr<HostCopy> other = weak.lock();
        if (other == nullptr) continue;
        any_alive = true;
        if (other.get() == &copy || other->back.defined() || other->unpacked == other->payloads) continue;
        other->back = bring_back(*other, /*ahead=*/true);
      }
      it = any_alive ? std::next(it) : groups.erase(it);
    }
  }

  at::Tensor unpack(Payload& payload) {
    if (payload.version.enabled() && payload.version.current_version() != payload.version_at_pack) {
      throw Error("CpuOffload.unpack: a tensor saved for backward (" + describe(payload) +
                  ") was modified by an inplace operation after it was saved (version " +
                  std::to_string(payload.version_at_pack) + ", now " +
                  std::to_string(payload.version.current_version()) +
                  "); backward would use a value other than the one forward saw and give a wrong gradient: "
                  "make that operation out-of-place, or clone the tensor before changing it");
    }
    if (payload.resident.defined()) return payload.resident;
    HostCopy& copy = *payload.copy;
    at::NoGradGuard no_grad;
    std::lock_guard lock(mutex);
    if (on_cuda()) settle_inflight(UINT64_MAX);
    prefetch_around(copy);
    at::Tensor tensor;
    if (copy.back.defined()) {
      stats.prefetch_hits += 1;
      if (copy.arrived) copy.arrived->block(current_stream(copy.options.device().index()));
      tensor = copy.back;
    } else {
      stats.prefetch_misses += 1;
      const auto start = Clock::now();
      tensor = bring_back(copy, /*ahead=*/false);
      stats.wait_seconds += std::chrono::duration<double>(Clock::now() - start).count();
      stats.wait_bytes += copy.bytes;
      copy.back = tensor;
    }
    if (!payload.unpacked) {
      payload.unpacked = true;
      copy.unpacked += 1;
    }
    // Once every payload has it, the device copy is autograd's alone (a second backward over a
    // retained graph copies it again).
    if (copy.unpacked == copy.payloads) copy.back = at::Tensor();
    return tensor;
  }

  // "Float [4, 8]": the saved tensor, for errors.
  static std::string describe(const Payload& payload) {
    if (payload.resident.defined()) {
      return std::string(c10::toString(payload.resident.scalar_type())) + " " + c10::str(payload.resident.sizes());
    }
    return std::string(c10::toString(payload.copy->options.dtype().toScalarType())) + " " +
           c10::str(at::IntArrayRef(payload.copy->sizes));
  }

  // The step's last payload gone: copies to the host that finished after backward's last unpack
  // let go of their device tensors now, not at the next step's first pack.
  void released_payload() {
    std::lock_guard lock(mutex);
    live_payloads -= 1;
    if (live_payloads == 0 && on_cuda()) settle_inflight(UINT64_MAX);
  }

  void released_copy(const HostCopy& copy) {
    std::lock_guard lock(mutex);
    stats.resident_host_bytes -= copy.bytes;
  }
};

namespace {

Payload::~Payload() {
  if (const std::shared_ptr<CpuOffload::HostCopies> copies = owner.lock()) copies->released_payload();
}

HostCopy::~HostCopy() {
  if (const std::shared_ptr<CpuOffload::HostCopies> copies = owner.lock()) copies->released_copy(*this);
}

// The payload in `any`, made by `copies`'s pack: another offloader's payload is refused (its
// bytes are counted, and its copy brought back, by the offloader that made it).
Payload& payload_of(const std::any& any, const CpuOffload::HostCopies& copies) {
  const auto* payload = std::any_cast<std::shared_ptr<Payload>>(&any);
  if (payload == nullptr || *payload == nullptr) {
    throw Error("CpuOffload.unpack: this payload was not made by a CpuOffload's pack; unpack the payloads of the "
                "same offloader's pack");
  }
  if ((*payload)->owner.lock().get() != &copies) {
    throw Error(
        "CpuOffload.unpack: this payload was made by another CpuOffload's pack; unpack each payload with "
        "the offloader that packed it");
  }
  return **payload;
}

}  // namespace

CpuOffload::CpuOffload(CpuOffloadOptions options) : copies_(std::make_shared<HostCopies>(options)) {}
CpuOffload::~CpuOffload() = default;

std::any CpuOffload::pack(const at::Tensor& tensor) { return copies_->pack(tensor); }
at::Tensor CpuOffload::unpack(const std::any& payload) { return copies_->unpack(payload_of(payload, *copies_)); }

CpuOffloadStats CpuOffload::stats() const {
  std::lock_guard lock(copies_->mutex);
  // inflight_bytes: copies still running. On a GPU the host runs ahead of the device, so copies
  // that finished after the last pack or unpack are settled here.
  if (copies_->on_cuda()) copies_->settle_inflight(UINT64_MAX);
  return copies_->stats;
}

const CpuOffloadOptions& CpuOffload::options() const { return copies_->options; }

}  // namespace remat
