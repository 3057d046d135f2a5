#include <remat/alloc/errors.hpp>
#include <remat/alloc/tags.hpp>

#include "fork_safety.hpp"
#include "message_text.hpp"

#include <atomic>
#include <cstdio>
#include <mutex>
#include <unordered_map>

namespace remat::alloc {
namespace {

struct TagHash {
  std::size_t operator()(const Tag& t) const noexcept {
    std::uint64_t h = t.region;
    h = h * 0x9E3779B97F4A7C15ULL + t.site;
    h = h * 0x9E3779B97F4A7C15ULL + t.label;
    h = h * 0x9E3779B97F4A7C15ULL + (static_cast<std::uint64_t>(t.module) << 8 | static_cast<std::uint64_t>(t.category));
    h = h * 0x9E3779B97F4A7C15ULL + (static_cast<std::uint64_t>(t.policy) << 8 | static_cast<std::uint64_t>(t.phase));
    if (t.has_recv) {
      h = h * 0x9E3779B97F4A7C15ULL + static_cast<std::uint32_t>(t.recv.stage);
      h = h * 0x9E3779B97F4A7C15ULL + static_cast<std::uint32_t>(t.recv.slot) * 2 +
          static_cast<std::uint64_t>(t.recv.direction);
    }
    return static_cast<std::size_t>(h ^ (h >> 29));
  }
};

// Interned names and tags only grow, so ids stay valid for the life of the process.
struct InternTables {
  std::mutex mutex;
  std::unordered_map<std::string, NameId> name_ids{{"", 0}};
  std::vector<std::string> names{""};
  std::unordered_map<Tag, TagId, TagHash> tag_ids{{Tag{}, 0}};
  std::vector<Tag> tags{Tag{}};
};

InternTables& tables() {
  static auto* instance = new InternTables();  // never destroyed: frees may run at exit
  return *instance;
}

struct Frame {
  ScopeKind kind;
  Tag tag;
  TagId id;
};

thread_local std::vector<Frame> t_stack;

// The label in force for every thread (0: none). Set rarely, read at every allocation.
std::atomic<NameId> g_label{0};

// This thread's latest stack top combined with the label, category and module in force: the
// hot path's answer while none of them changes. Other combinations the thread has made are in
// t_overlaid, so that moving between regions or modules takes no lock either.
struct OverlayKey {
  TagId base = 0;
  NameId label = 0;
  NameId module = 0;
  Category category = Category::none;
  bool operator==(const OverlayKey&) const = default;
};
struct OverlayHash {
  std::size_t operator()(const OverlayKey& k) const noexcept {
    std::uint64_t h = k.base;
    h = h * 0x9E3779B97F4A7C15ULL + k.label;
    h = h * 0x9E3779B97F4A7C15ULL + (static_cast<std::uint64_t>(k.module) << 8 | static_cast<std::uint64_t>(k.category));
    return static_cast<std::size_t>(h ^ (h >> 29));
  }
};
struct OverlaidTag {
  OverlayKey key;
  TagId id = 0;
};
// What every allocation reads, in one thread-local object (in a shared library each thread-local
// variable costs a lookup call).
struct ThreadTop {
  TagId current_id = 0;  // of t_stack's top, without the overlay; kept in step with t_stack
  // This thread's category and module (set_category): none and 0 when not set.
  Category category = Category::none;
  NameId module = 0;
  OverlaidTag overlaid_latest;
};
thread_local ThreadTop t_top;
thread_local std::unordered_map<OverlayKey, TagId, OverlayHash> t_overlaid;

Tag top_tag() { return t_stack.empty() ? Tag{} : t_stack.back().tag; }

std::string describe(const Frame& frame);

std::string describe_innermost() { return t_stack.empty() ? std::string("none") : detail::quote(describe(t_stack.back())); }

// A push derives the child tag from the innermost one. Interned ids never change, so each
// thread remembers the children it has derived and later pushes take no lock and build no
// strings. `value` holds an enum or receive slot, `name` a region or site name.
struct ChildView {
  TagId parent;
  ScopeKind kind;
  std::uint64_t value;
  std::string_view name;
};
struct ChildKey {
  TagId parent;
  ScopeKind kind;
  std::uint64_t value;
  std::string name;
};
struct ChildHash {
  using is_transparent = void;
  std::size_t operator()(const ChildView& k) const noexcept {
    std::uint64_t h = std::hash<std::string_view>{}(k.name);
    h = h * 0x9E3779B97F4A7C15ULL + k.parent;
    h = h * 0x9E3779B97F4A7C15ULL + (k.value << 3 | static_cast<std::uint64_t>(k.kind));
    return static_cast<std::size_t>(h ^ (h >> 29));
  }
  std::size_t operator()(const ChildKey& k) const noexcept { return (*this)(ChildView{k.parent, k.kind, k.value, k.name}); }
};
struct ChildEqual {
  using is_transparent = void;
  template <typename A, typename B>
  bool operator()(const A& a, const B& b) const noexcept {
    return a.parent == b.parent && a.kind == b.kind && a.value == b.value &&
           std::string_view(a.name) == std::string_view(b.name);
  }
};
struct Derived {
  Tag tag;
  TagId id;
};
thread_local std::unordered_map<ChildKey, Derived, ChildHash, ChildEqual> t_children;

template <typename Derive>
void push_child(ScopeKind kind, std::uint64_t value, std::string_view name, Derive derive) {
  if (t_stack.size() >= kMaxTagDepth) {
    throw TagStackError("tag stack is already " + std::to_string(kMaxTagDepth) + " scopes deep on this thread (innermost " +
                        describe_innermost() + ") at the push of a " + std::string(to_string(kind)) +
                        " scope: a scope is pushed without its pop, in a loop perhaps; pop every push (RAII "
                        "scopes in C++, with-blocks in Python)");
  }
  const ChildView key{t_top.current_id, kind, value, name};
  auto it = t_children.find(key);
  if (it == t_children.end()) {
    const Tag tag = derive(top_tag());
    it = t_children.emplace(ChildKey{key.parent, kind, value, std::string(name)}, Derived{tag, intern_tag(tag)}).first;
  }
  t_stack.push_back(Frame{kind, it->second.tag, it->second.id});
  t_top.current_id = it->second.id;
}

// `what` names the text in messages ("site name", "label"); `noun` is what to shorten.
void require_short(std::string_view text, std::string_view what, std::string_view noun) {
  if (text.size() > kMaxTagNameBytes) {
    throw InvalidArgumentError(std::string(what) + " " + detail::quote(text) + " is longer than " +
                               std::to_string(kMaxTagNameBytes) + " bytes; pass a shorter " + std::string(noun));
  }
}

void require_name(std::string_view name, std::string_view what) {
  if (name.empty()) {
    throw InvalidArgumentError(std::string(what) + " name is empty; pass a non-empty name such as \"layers.0\"");
  }
  if (name.size() > kMaxTagNameBytes) {  // the message's text is built only to refuse
    require_short(name, std::string(what) + " name", "name");
  }
}

// The stack top combined with the overlay in `key`, interned on first use; the stack top alone
// when host memory runs out while interning (the allocation goes without the overlay). Out of
// line: current_tag_id's common paths stay short.
[[gnu::noinline]] TagId overlaid_tag_id(const OverlayKey& key) noexcept {
  try {
    auto it = t_overlaid.find(key);
    if (it == t_overlaid.end()) {
      Tag tag = top_tag();
      tag.label = key.label;
      tag.category = key.category;
      tag.module = key.module;
      it = t_overlaid.emplace(key, intern_tag(tag)).first;
    }
    t_top.overlaid_latest = {key, it->second};
    return it->second;
  } catch (...) {
    return key.base;
  }
}

constexpr Category kCategories[] = {Category::none,       Category::parameter, Category::gradient,
                                    Category::optimizer_state, Category::activation, Category::temporary,
                                    Category::input,      Category::other};

}  // namespace

std::string_view to_string(Policy policy) {
  switch (policy) {
    case Policy::save: return "save";
    case Policy::recompute: return "recompute";
    case Policy::none: break;
  }
  return "none";
}

std::string_view to_string(Phase phase) {
  switch (phase) {
    case Phase::forward: return "forward";
    case Phase::recompute: return "recompute";
    case Phase::backward: return "backward";
    case Phase::offloaded: return "offloaded";
    case Phase::other: break;
  }
  return "other";
}

std::string_view to_string(Category category) {
  switch (category) {
    case Category::parameter: return "parameter";
    case Category::gradient: return "gradient";
    case Category::optimizer_state: return "optimizer_state";
    case Category::activation: return "activation";
    case Category::temporary: return "temporary";
    case Category::input: return "input";
    case Category::other: return "other";
    case Category::none: break;
  }
  return "none";
}

Category category_from_string(std::string_view text) {
  for (const Category candidate : kCategories) {
    if (text == to_string(candidate)) return candidate;
  }
  throw InvalidArgumentError("category " + detail::quote(text) +
                             " is not valid; pass parameter, gradient, optimizer_state, activation, temporary, "
                             "input, other or none");
}

char to_char(Direction direction) { return direction == Direction::forward ? 'F' : 'B'; }

std::string_view to_string(ScopeKind kind) {
  switch (kind) {
    case ScopeKind::region: return "region";
    case ScopeKind::policy: return "policy";
    case ScopeKind::phase: return "phase";
    case ScopeKind::recv_slot: return "recv_slot";
    case ScopeKind::site: return "site";
  }
  return "unknown";
}

NameId intern_name(std::string_view name) {
  InternTables& t = tables();
  std::lock_guard lock(t.mutex);
  const auto [it, inserted] = t.name_ids.try_emplace(std::string(name), static_cast<NameId>(t.names.size()));
  if (inserted) t.names.emplace_back(name);
  return it->second;
}

std::string name_of(NameId id) {
  InternTables& t = tables();
  std::lock_guard lock(t.mutex);
  return id < t.names.size() ? t.names[id] : std::string();
}

std::vector<std::string> interned_names() {
  InternTables& t = tables();
  std::lock_guard lock(t.mutex);
  return t.names;
}

TagId intern_tag(const Tag& tag) {
  InternTables& t = tables();
  std::lock_guard lock(t.mutex);
  const auto [it, inserted] = t.tag_ids.try_emplace(tag, static_cast<TagId>(t.tags.size()));
  if (inserted) t.tags.push_back(tag);
  return it->second;
}

Tag tag_of(TagId id) {
  InternTables& t = tables();
  std::lock_guard lock(t.mutex);
  return id < t.tags.size() ? t.tags[id] : Tag{};
}

std::vector<Tag> interned_tags() {
  InternTables& t = tables();
  std::lock_guard lock(t.mutex);
  return t.tags;
}

namespace detail {

void hold_tag_tables_for_fork() { tables().mutex.lock(); }
void release_tag_tables_after_fork() { tables().mutex.unlock(); }

}  // namespace detail

TagId current_tag_id() noexcept {
  const ThreadTop& top = t_top;
  const OverlayKey key{top.current_id, g_label.load(std::memory_order_relaxed), top.module, top.category};
  if (key.label == 0 && key.module == 0 && key.category == Category::none) return key.base;
  if (top.overlaid_latest.key == key) return top.overlaid_latest.id;
  return overlaid_tag_id(key);
}

Tag current_tag() {
  Tag tag = top_tag();
  tag.label = g_label.load(std::memory_order_relaxed);
  tag.category = t_top.category;
  tag.module = t_top.module;
  return tag;
}

void set_label(std::string_view label) {
  require_short(label, "label", "label");
  g_label.store(label.empty() ? 0 : intern_name(label), std::memory_order_relaxed);
}

std::string current_label() { return name_of(g_label.load(std::memory_order_relaxed)); }

std::string region_path(std::string_view outer, std::string_view inner) {
  std::string path;
  path.reserve(outer.size() + kRegionSeparator.size() + inner.size());
  return path.append(outer).append(kRegionSeparator).append(inner);
}

std::string_view region_to_push(std::string_view current, std::string_view path) {
  for (std::size_t end = path.size(); end != std::string_view::npos && end > 0;
       end = end == 0 ? std::string_view::npos : path.rfind(kRegionSeparator, end - 1)) {
    const std::string_view head = path.substr(0, end);
    const bool ends_current =
        current == head || (current.size() > head.size() && current.ends_with(head) &&
                            current.substr(0, current.size() - head.size()).ends_with(kRegionSeparator));
    if (ends_current) return end == path.size() ? std::string_view() : path.substr(end + kRegionSeparator.size());
  }
  return path;
}

void set_category(Category category, std::string_view module) {
  require_short(module, "module path", "module path");
  t_top.module = module.empty() ? 0 : intern_name(module);
  t_top.category = category;
}

std::pair<Category, std::string> current_category() { return {t_top.category, name_of(t_top.module)}; }

void set_category_by_id(Category category, NameId module) noexcept {
  t_top.module = module;
  t_top.category = category;
}

std::pair<Category, NameId> current_category_id() noexcept { return {t_top.category, t_top.module}; }

bool category_in_force() noexcept { return t_top.category != Category::none; }

TagId with_category(TagId tag, Category category, std::optional<std::string_view> module) {
  Tag changed = tag_of(tag);
  changed.category = category;
  if (module) {
    require_short(*module, "module path", "module path");
    changed.module = module->empty() ? 0 : intern_name(*module);
  }
  return intern_tag(changed);
}

// The interned path of region `name` inside region `parent` (0: none).
static NameId nested_region(NameId parent, std::string_view name) {
  if (parent == 0) return intern_name(name);
  const std::string path = region_path(name_of(parent), name);
  if (path.size() > kMaxTagNameBytes) {
    throw InvalidArgumentError("region path " + detail::quote(path) + " is longer than " +
                               std::to_string(kMaxTagNameBytes) + " bytes at the push of region " +
                               detail::quote(name) + ": regions nested this deep are a region pushed without its " +
                               "pop; pop every push");
  }
  return intern_name(path);
}

void push_region(std::string_view name) {
  require_name(name, "region");
  push_child(ScopeKind::region, 0, name, [name](Tag tag) {
    tag.region = nested_region(tag.region, name);
    return tag;
  });
}

void push_region(std::string_view name, Policy policy) {
  require_name(name, "region");
  // value 0 is the plain region push, which keeps the enclosing policy
  push_child(ScopeKind::region, 1 + static_cast<std::uint64_t>(policy), name, [name, policy](Tag tag) {
    tag.region = nested_region(tag.region, name);
    tag.policy = policy;
    return tag;
  });
}

void push_policy(Policy policy) {
  push_child(ScopeKind::policy, static_cast<std::uint64_t>(policy), {}, [policy](Tag tag) {
    tag.policy = policy;
    return tag;
  });
}

void push_phase(Phase phase) {
  push_child(ScopeKind::phase, static_cast<std::uint64_t>(phase), {}, [phase](Tag tag) {
    tag.phase = phase;
    return tag;
  });
}

void push_recv_slot(RecvSlot slot) {
  if (slot.stage < 0 || slot.slot < 0) {
    throw InvalidArgumentError("receive slot stage=" + std::to_string(slot.stage) + " slot=" +
                               std::to_string(slot.slot) + " is negative; stage and slot are indices >= 0");
  }
  const std::uint64_t value = static_cast<std::uint64_t>(slot.stage) << 32 |
                              static_cast<std::uint64_t>(slot.slot) << 1 | static_cast<std::uint64_t>(slot.direction);
  push_child(ScopeKind::recv_slot, value, {}, [slot](Tag tag) {
    tag.has_recv = true;
    tag.recv = slot;
    return tag;
  });
}

void push_site(std::string_view name) {
  require_name(name, "site");
  push_child(ScopeKind::site, 0, name, [name](Tag tag) {
    tag.site = intern_name(name);
    return tag;
  });
}

void pop_tag(ScopeKind kind) {
  if (t_stack.empty()) {
    throw TagStackError("pop of a " + std::string(to_string(kind)) +
                        " scope on an empty tag stack; every pop must match an earlier push on the same thread");
  }
  const Frame& top = t_stack.back();
  if (top.kind != kind) {
    throw TagStackError("pop of a " + std::string(to_string(kind)) + " scope, but the innermost scope is a " +
                        std::string(to_string(top.kind)) + "; pop scopes in the reverse order of their pushes");
  }
  t_stack.pop_back();
  t_top.current_id = t_stack.empty() ? 0 : t_stack.back().id;
}

std::size_t tag_stack_depth() noexcept { return t_stack.size(); }

namespace {

std::string describe(const Frame& frame) {
  std::string text(to_string(frame.kind));
  text += ' ';
  switch (frame.kind) {
    case ScopeKind::region: text += name_of(frame.tag.region); break;
    case ScopeKind::policy: text += to_string(frame.tag.policy); break;
    case ScopeKind::phase: text += to_string(frame.tag.phase); break;
    case ScopeKind::site: text += name_of(frame.tag.site); break;
    case ScopeKind::recv_slot:
      text += std::to_string(frame.tag.recv.stage) + to_char(frame.tag.recv.direction) +
              std::to_string(frame.tag.recv.slot);
      break;
  }
  return text;
}

}  // namespace

std::vector<std::string> describe_tag_stack() {
  std::vector<std::string> out;
  out.reserve(t_stack.size());
  for (const Frame& frame : t_stack) out.push_back(describe(frame));
  return out;
}

std::string source_site(const std::source_location& where) {
  std::string_view file = where.file_name();
  const auto slash = file.find_last_of('/');
  if (slash != std::string_view::npos) file.remove_prefix(slash + 1);
  return std::string(file) + ":" + std::to_string(where.line());
}

TagScope::~TagScope() {
  if (!active_) return;
  try {
    pop_tag(kind_);
  } catch (const Error& e) {
    // A destructor must not throw; a mismatched stack is a caller bug worth seeing.
    std::fprintf(stderr, "remat: %s\n", e.what());
  }
}

}  // namespace remat::alloc
