#pragma once
// What an allocation belongs to. The tag in force is the top of a thread-local stack that
// RAII scopes (C++) or push/pop calls (C ABI) change, combined with the process-wide label
// (set_label) and the thread's category and module (set_category); every block copies it at
// allocation, and retag_block changes a live block's category afterwards. Names and whole tags are interned
// process-wide, so a block stores one small id.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <source_location>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace remat::alloc {

enum class Policy : std::uint8_t { none, save, recompute };
inline constexpr int kPolicyCount = 3;
// offloaded: host copies of what a checkpoint keeps (remat.CpuOffload), not device memory in use.
enum class Phase : std::uint8_t { other, forward, recompute, backward, offloaded };
inline constexpr int kPhaseCount = 5;
enum class Direction : std::uint8_t { forward, backward };  // 'F' / 'B' in schedules
// What the memory is for in a training step, as remat_alloc.track assigns it without annotations
// (activation: kept by autograd for backward; temporary: the rest of a module's work). none: no
// category assigned. The values are the C ABI's REMAT_CATEGORY_* constants.
enum class Category : std::uint8_t { none, parameter, gradient, optimizer_state, activation, temporary, input, other };
inline constexpr int kCategoryCount = 8;

std::string_view to_string(Policy policy);
std::string_view to_string(Phase phase);
std::string_view to_string(Category category);
// The category called `text` ("parameter", ..., "none"); throws InvalidArgumentError naming the
// valid ones otherwise.
Category category_from_string(std::string_view text);
char to_char(Direction direction);

using NameId = std::uint32_t;  // 0 is the empty name
using TagId = std::uint32_t;   // 0 is the untagged tag

struct RecvSlot {
  std::int32_t stage = 0;
  Direction direction = Direction::forward;
  std::int32_t slot = 0;
  bool operator==(const RecvSlot&) const = default;
};

struct Tag {
  NameId region = 0;  // interned path such as "layers.0::attention"
  Policy policy = Policy::none;
  Phase phase = Phase::other;
  bool has_recv = false;
  RecvSlot recv{};
  NameId site = 0;
  NameId label = 0;  // the process-wide label in force (set_label), never held by a stack frame
  Category category = Category::none;  // the thread's category (set_category) or a retag's
  NameId module = 0;                   // the module path the category belongs to ("layers.0.mlp")
  bool operator==(const Tag&) const = default;
};

NameId intern_name(std::string_view name);
std::string name_of(NameId id);
// Every interned name, indexed by NameId.
std::vector<std::string> interned_names();

TagId intern_tag(const Tag& tag);
Tag tag_of(TagId id);
// Every interned tag, indexed by TagId.
std::vector<Tag> interned_tags();

// The tag in force on this thread: its stack's top combined with the label (0 when nothing
// is pushed and no label is set).
TagId current_tag_id() noexcept;
Tag current_tag();

// A label for every allocation that follows, on every thread, on top of each thread's tag
// stack: what PyTorch's torch.cuda.memory._set_memory_metadata sets. An empty label clears
// it. Labels follow the rules of site names (at most kMaxTagNameBytes, else
// InvalidArgumentError, and the label in force is kept).
void set_label(std::string_view label);
std::string current_label();

// The category and module of every allocation that follows on this thread (the module path
// follows the rules of site names; "" for none). Set, not pushed: a caller that nests saves the
// previous value (current_category) and sets it back, so an exception cannot unbalance a stack.
void set_category(Category category, std::string_view module);
std::pair<Category, std::string> current_category();
// The same by the module's interned name (intern_name), without interning or a lock: for callers
// that change it at every module call (tracking's hooks).
void set_category_by_id(Category category, NameId module) noexcept;
std::pair<Category, NameId> current_category_id() noexcept;
// Whether this thread has a category set (cheap: for hot paths that only act while tracking).
bool category_in_force() noexcept;
// The tag `tag` with its category set to `category` and, unless `module` is nullopt, its module
// set to `module` ("" clears it); interned.
TagId with_category(TagId tag, Category category, std::optional<std::string_view> module);

enum class ScopeKind : std::uint8_t { region, policy, phase, recv_slot, site };

// Frames one thread's tag stack may hold. Real nesting is a handful deep; a stack this deep
// is a scope pushed without its pop (in a loop, say), and the push past it fails with
// TagStackError instead of growing without bound.
inline constexpr std::size_t kMaxTagDepth = 1024;
// The longest region path ("layers.0::attention::...") or site name, in bytes; longer ones
// are refused (InvalidArgumentError). Together the two bound a thread's tag memory.
inline constexpr std::size_t kMaxTagNameBytes = 4096;
std::string_view to_string(ScopeKind kind);

// Region paths: a region pushed inside another is "outer::inner".
inline constexpr std::string_view kRegionSeparator = "::";
std::string region_path(std::string_view outer, std::string_view inner);
// What to push so that the region in force becomes `path` (a checkpoint's region path,
// "layers.0::attention"), given the one in force now, `current`: the part of `path` past the
// longest run of its leading components that ends `current` ("outer::layers.0" and
// "layers.0::attention" give "attention"; "" gives the whole path; the path itself, nothing).
std::string_view region_to_push(std::string_view current, std::string_view path);

// Pushing a region inside another composes the path: "layers.0" then "attention" gives
// "layers.0::attention". Empty names are rejected (InvalidArgumentError). Every push throws
// TagStackError on a stack already kMaxTagDepth deep.
void push_region(std::string_view name);
// A region and its checkpoint policy in one frame (one push instead of two).
void push_region(std::string_view name, Policy policy);
void push_policy(Policy policy);
void push_phase(Phase phase);
void push_recv_slot(RecvSlot slot);
void push_site(std::string_view name);
// Pops the top frame, which must be of `kind`; throws TagStackError otherwise, leaving the
// stack unchanged.
void pop_tag(ScopeKind kind);
std::size_t tag_stack_depth() noexcept;
// The frames from bottom to top, as text (for reports): "region layers.0", "site experts".
std::vector<std::string> describe_tag_stack();

// "file.cpp:123" for a source location (the file's base name).
std::string source_site(const std::source_location& where);

// This thread's category and module for a scope; the ones in force before come back at its end.
class [[nodiscard]] CategoryScope {
 public:
  CategoryScope(Category category, std::string_view module) : previous_(current_category()) {
    set_category(category, module);
  }
  CategoryScope(const CategoryScope&) = delete;
  CategoryScope& operator=(const CategoryScope&) = delete;
  ~CategoryScope() {
    try {
      set_category(previous_.first, previous_.second);
    } catch (...) {  // host memory exhausted interning the name: nothing to restore it with
    }
  }

 private:
  std::pair<Category, std::string> previous_;
};

// RAII scopes over the push/pop calls.
class [[nodiscard]] TagScope {
 public:
  static TagScope region(std::string_view name) { push_region(name); return TagScope(ScopeKind::region); }
  static TagScope region(std::string_view name, Policy policy) {
    push_region(name, policy);
    return TagScope(ScopeKind::region);
  }
  static TagScope policy(Policy policy) { push_policy(policy); return TagScope(ScopeKind::policy); }
  static TagScope phase(Phase phase) { push_phase(phase); return TagScope(ScopeKind::phase); }
  static TagScope recv_slot(RecvSlot slot) { push_recv_slot(slot); return TagScope(ScopeKind::recv_slot); }
  static TagScope site(std::string_view name) { push_site(name); return TagScope(ScopeKind::site); }
  // The caller's file and line as the site, e.g. "attention.cpp:42".
  static TagScope site_here(std::source_location where = std::source_location::current()) {
    return site(source_site(where));
  }

  TagScope(TagScope&& other) noexcept : kind_(other.kind_), active_(other.active_) { other.active_ = false; }
  TagScope(const TagScope&) = delete;
  TagScope& operator=(const TagScope&) = delete;
  TagScope& operator=(TagScope&&) = delete;
  ~TagScope();

 private:
  explicit TagScope(ScopeKind kind) : kind_(kind) {}
  ScopeKind kind_;
  bool active_ = true;
};

}  // namespace remat::alloc

#define REMAT_SITE_CONCAT_INNER(a, b) a##b
#define REMAT_SITE_CONCAT(a, b) REMAT_SITE_CONCAT_INNER(a, b)
// Marks allocations in the rest of the enclosing block with an allocation site:
// REMAT_SITE("experts"), or REMAT_SITE_HERE() for this file and line.
#define REMAT_SITE(name) \
  const auto REMAT_SITE_CONCAT(remat_site_scope_, __LINE__) = ::remat::alloc::TagScope::site(name)
#define REMAT_SITE_HERE() \
  const auto REMAT_SITE_CONCAT(remat_site_scope_, __LINE__) = ::remat::alloc::TagScope::site_here()
