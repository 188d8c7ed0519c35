// haliax/core.hpp: the named array, its run-time shape, and the Kokkos runtime it lives on.
//
//   named_array<float, axes<Batch, Embed>> x = haliax::zeros<float>(4 * Batch, 768 * Embed);
//   x.size(Embed) == 768;  x.shape_string() == "{batch=4, embed=768}"
//
// An array is a shallow handle over a contiguous, row-major Kokkos View (order = the order of its axes)
// plus the run-time sizes. Copying the handle shares the buffer, as a View does; ops return new arrays.
#pragma once

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <memory>
#include <map>
#include <mutex>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "axis.hpp"
#include "bf16.hpp"
#include "detail/axis_algebra.hpp"
#include "detail/portable.hpp"
#include "detail/thread_pool.hpp"

namespace haliax {

using execution_space = Kokkos::DefaultExecutionSpace;
using memory_space = execution_space::memory_space;

/// Element types an array may hold.
template <class T>
concept Element = std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, bf16> ||
    std::is_same_v<T, std::int32_t> || std::is_same_v<T, bool>;

/// Floating element types (the ones with transcendental functions and gradients).
template <class T>
concept FloatElement = std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, bf16>;

/// Element types with arithmetic (+ - * /).
template <class T>
concept NumericElement = FloatElement<T> || std::is_same_v<T, std::int32_t>;

/// The type arithmetic is done in: float for bf16, the type itself otherwise.
template <class T>
using compute_t = std::conditional_t<std::is_same_v<T, bf16>, float, T>;

// ---------------------------------------------------------------------------------------------------------
// Buffer cache
//
// Every op returns a new array, so a training step allocates the same buffers again and again. Fresh large
// allocations come from mmap and pay a page fault per 4 KiB on first touch (measured here: a copy into a new
// 823 MB array ran at 2.2 GB/s against 15 GB/s for a copy into an existing one). Like PyTorch's caching
// allocator, haliax keeps released buffers and hands them out again for the same element type and size.
// A buffer returns to the cache only when no view of it is left, so cached memory is never aliased.

namespace detail {

/// Upper bound of cached (idle) bytes across all element types: HALIAX_CACHE_MB, default 4096.
inline std::size_t cache_limit_bytes() {
  static const std::size_t limit = [] {
    const char* env = std::getenv("HALIAX_CACHE_MB");
    long long mb = env ? std::atoll(env) : 4096;
    return static_cast<std::size_t>(mb < 0 ? 0 : mb) << 20;
  }();
  return limit;
}

/// HALIAX_POISON_BUFFERS=1: every buffer the cache hands out is first filled with 0xFF bytes (NaN as a float,
/// double or bfloat16, -1 as an integer), so an op that leaves part of its output unwritten shows NaN or -1 in
/// it, never stale values or the zeros of fresh memory. For checks (the device kit runs its kernel checks so);
/// costs one pass over every buffer.
inline bool poison_buffers() {
  static const bool on = [] {
    const char* e = std::getenv("HALIAX_POISON_BUFFERS");
    return e != nullptr && e[0] != '\0' && !(e[0] == '0' && e[1] == '\0');
  }();
  return on;
}

/// Fills `bytes` bytes at `p` (array memory) with 0xFF, in a kernel.
inline void poison_fill(void* p, std::size_t bytes) {
  auto* q = static_cast<unsigned char*>(p);
  Kokkos::parallel_for(
      "haliax::poison", Kokkos::RangePolicy<Kokkos::DefaultExecutionSpace, Kokkos::IndexType<std::int64_t>>(0, static_cast<std::int64_t>(bytes)),
      KOKKOS_LAMBDA(std::int64_t i) { q[i] = 0xFF; });
}

/// How much idle memory a miss leaves in the cache, relative to the memory arrays hold:
/// HALIAX_CACHE_IDLE_RATIO, default 0.5 (0: give back idle buffers on every miss of 1 MiB or more). Only until a
/// program marks steps (buffer_cache_step_boundary): from then on a miss gives nothing back, and a buffer left idle
/// through a whole step is given back at the step's end.
inline double idle_ratio() {
  static const double r = [] {
    const char* env = std::getenv("HALIAX_CACHE_IDLE_RATIO");
    const double v = env ? std::atof(env) : 0.5;
    return v >= 0 ? v : 0.0;
  }();
  return r;
}

struct cache_registry {
  std::mutex m;
  std::size_t cached_bytes = 0;  // idle, in the cache
  std::size_t leased_bytes = 0;  // handed out and not yet given back
  std::size_t peak_leased_bytes = 0;  // the most leased at once since the last reset_buffer_cache_peak()
  std::uint64_t step = 0;             // step boundaries marked so far (buffer_cache_step_boundary)
  std::vector<void (*)()> clearers;
  std::vector<void (*)(std::uint64_t)> sweepers;  // give back the buffers idle since before a step
  // statistics (under m); HALIAX_CACHE_TRACE prints every miss, eviction and drop of 1 MiB or more to stderr
  std::int64_t hits = 0, misses = 0, miss_bytes = 0, evicted = 0, evicted_bytes = 0, dropped_shared = 0,
               dropped_shared_bytes = 0, dropped_full = 0, dropped_full_bytes = 0;
  static bool trace() {
    static const bool on = std::getenv("HALIAX_CACHE_TRACE") != nullptr;
    return on;
  }
  static cache_registry& instance() {
    static cache_registry r;
    return r;
  }
};

template <class T>
struct buffer_cache {
  using view_type = Kokkos::View<T*, Kokkos::DefaultExecutionSpace::memory_space>;
  struct idle_buffer {
    view_type view;
    std::uint64_t step;  // the step in which it was last given back
  };
  std::unordered_multimap<std::size_t, idle_buffer> idle;

  static buffer_cache& instance() {
    static buffer_cache* c = [] {
      auto* p = new buffer_cache();  // never destroyed: views are released by clear() before finalize
      auto& reg = cache_registry::instance();
      std::lock_guard<std::mutex> lk(reg.m);
      reg.clearers.push_back(&buffer_cache::clear);
      reg.sweepers.push_back(&buffer_cache::sweep);
      return p;
    }();
    return *c;
  }

  /// A buffer of exactly n elements: an idle one if there is one, else a new allocation.
  static view_type acquire(std::size_t n, const std::string& label) {
    view_type v = take(n, label);
    if (poison_buffers() && n > 0) poison_fill(v.data(), n * sizeof(T));
    return v;
  }

  /// acquire() without the poison.
  static view_type take(std::size_t n, const std::string& label) {
    auto& c = instance();  // registers itself under the registry lock: call before taking it
    auto& reg = cache_registry::instance();
    {
      std::lock_guard<std::mutex> lk(reg.m);
      auto it = c.idle.find(n);
      if (it != c.idle.end()) {
        view_type v = std::move(it->second.view);
        c.idle.erase(it);
        reg.cached_bytes -= n * sizeof(T);
        reg.leased_bytes += n * sizeof(T);
        reg.peak_leased_bytes = std::max(reg.peak_leased_bytes, reg.leased_bytes);
        ++reg.hits;
        return v;
      }
      ++reg.misses;
      reg.miss_bytes += static_cast<std::int64_t>(n * sizeof(T));
      if (cache_registry::trace() && n * sizeof(T) >= (1u << 20))
        std::fprintf(stderr, "haliax cache: miss %zu B %s (idle %zu B)\n", n * sizeof(T), label.c_str(),
                     reg.cached_bytes);
      // A miss: before growing the process, give back idle buffers of other sizes worth up to this one while
      // the cache holds more idle memory than HALIAX_CACHE_IDLE_RATIO (0.5) of what arrays hold, so phases with
      // other shapes (initialisation temporaries, a recomputed layer) do not pin their high-water mark for the
      // rest of the run. Below that ratio the idle buffers stay: a training step's forward and backward need
      // different sizes, and giving back one phase's buffers on every miss of the other made each step map
      // about 0.9 GB afresh (GPT-2 small at 4 x 64: 274 misses and 0.4 s of page faults a step; none now).
      // Small requests are left alone (they come from the malloc heap and barely move the resident size). The
      // smallest idle buffer at least as large goes first, else the largest smaller ones; never one more than
      // twice the request (a missed 3 MB activation once pushed out a 154 MB embedding gradient). Idle bytes
      // stay bounded by HALIAX_CACHE_MB as well. Once steps are marked, a miss gives nothing back: the sizes a
      // step needs then stay for the next step (a ratio evicting one phase's buffers for the other's still cost a
      // small GPT-2 step 57 misses, 120 MB, every step), and what a whole step left idle goes at its end (sweep).
      const std::size_t want = n * sizeof(T);
      reg.leased_bytes += want;
      reg.peak_leased_bytes = std::max(reg.peak_leased_bytes, reg.leased_bytes);
      std::size_t freed = 0;
      while (reg.step == 0 && want >= (std::size_t{1} << 20) && freed < want && !c.idle.empty() &&
             double(reg.cached_bytes) > idle_ratio() * double(reg.leased_bytes)) {
        auto victim = c.idle.end();
        auto largest_smaller = c.idle.end();
        for (auto e = c.idle.begin(); e != c.idle.end(); ++e) {
          if (e->first < n) {
            if (largest_smaller == c.idle.end() || e->first > largest_smaller->first) largest_smaller = e;
          } else if (e->first <= 2 * n && (victim == c.idle.end() || e->first < victim->first)) {
            victim = e;
          }
        }
        if (victim == c.idle.end()) victim = largest_smaller;
        if (victim == c.idle.end()) break;
        freed += victim->first * sizeof(T);
        reg.cached_bytes -= victim->first * sizeof(T);
        ++reg.evicted;
        reg.evicted_bytes += static_cast<std::int64_t>(victim->first * sizeof(T));
        if (cache_registry::trace())
          std::fprintf(stderr, "haliax cache:   evict %zu B %s\n", victim->first * sizeof(T),
                       victim->second.view.label().c_str());
        c.idle.erase(victim);
      }
    }
    return view_type(Kokkos::view_alloc(Kokkos::WithoutInitializing, label), n);
  }

  /// Takes back a buffer no one references any more (else it is simply dropped).
  static void release(view_type& v) {
    if (v.extent(0) == 0) return;
    const std::size_t bytes = v.extent(0) * sizeof(T);
    auto& c = instance();
    auto& reg = cache_registry::instance();
    std::lock_guard<std::mutex> lk(reg.m);
    reg.leased_bytes -= std::min(reg.leased_bytes, bytes);
    if (v.use_count() != 1) {
      ++reg.dropped_shared;
      reg.dropped_shared_bytes += static_cast<std::int64_t>(bytes);
      if (cache_registry::trace() && bytes >= (1u << 20))
        std::fprintf(stderr, "haliax cache: dropped (still viewed) %zu B %s\n", bytes, v.label().c_str());
      return;
    }
    if (!Kokkos::is_initialized() || reg.cached_bytes + bytes > cache_limit_bytes()) {
      ++reg.dropped_full;
      reg.dropped_full_bytes += static_cast<std::int64_t>(bytes);
      if (cache_registry::trace() && bytes >= (1u << 20))
        std::fprintf(stderr, "haliax cache: dropped (cache full) %zu B %s\n", bytes, v.label().c_str());
      return;
    }
    c.idle.emplace(v.extent(0), idle_buffer{v, reg.step});
    v = view_type();
    reg.cached_bytes += bytes;
  }

  /// Gives back the idle buffers last given back before step `before` (under the registry lock).
  static void sweep(std::uint64_t before) {
    auto& c = instance();
    auto& reg = cache_registry::instance();
    for (auto it = c.idle.begin(); it != c.idle.end();) {
      if (it->second.step < before) {
        const std::size_t bytes = it->first * sizeof(T);
        reg.cached_bytes -= bytes;
        ++reg.evicted;
        reg.evicted_bytes += static_cast<std::int64_t>(bytes);
        if (cache_registry::trace() && bytes >= (1u << 20))
          std::fprintf(stderr, "haliax cache:   idle through a step %zu B %s\n", bytes,
                       it->second.view.label().c_str());
        it = c.idle.erase(it);
      } else {
        ++it;
      }
    }
  }

  static void clear() {
    auto& c = instance();
    for (auto& [n, v] : c.idle) cache_registry::instance().cached_bytes -= n * sizeof(T);
    c.idle.clear();
  }
};

/// Keeps a cached buffer leased to the arrays that share it; gives it back to the cache when the last goes.
template <class T>
struct buffer_lease {
  typename buffer_cache<T>::view_type view;
  ~buffer_lease() { buffer_cache<T>::release(view); }
};

}  // namespace detail

/// Counters of haliax's buffer cache since the process started (all element types): requests served from the
/// cache (`hits`) and by a fresh allocation (`misses`, `miss_bytes`), idle buffers given back to make room
/// (`evicted`), buffers not cached because the cache was full (`dropped_full`), bytes idle and in use now.
/// A training step that repeats the previous one's shapes should show no misses (bench_gpt2_step reports them).
/// `peak_leased_bytes` is the most memory arrays held at once since the last `reset_buffer_cache_peak()`.
struct buffer_cache_stats {
  std::int64_t hits = 0, misses = 0, miss_bytes = 0, evicted = 0, evicted_bytes = 0, dropped_full = 0,
               dropped_full_bytes = 0, dropped_shared = 0, dropped_shared_bytes = 0;
  std::size_t idle_bytes = 0, leased_bytes = 0, peak_leased_bytes = 0;
};
inline buffer_cache_stats buffer_cache_statistics() {
  auto& r = detail::cache_registry::instance();
  std::lock_guard<std::mutex> lk(r.m);
  return {r.hits,         r.misses,          r.miss_bytes,   r.evicted,         r.evicted_bytes,
          r.dropped_full, r.dropped_full_bytes, r.dropped_shared, r.dropped_shared_bytes, r.cached_bytes,
          r.leased_bytes, r.peak_leased_bytes};
}

/// Starts a new high-water mark of `buffer_cache_stats::peak_leased_bytes` at what arrays hold now.
inline void reset_buffer_cache_peak() {
  auto& r = detail::cache_registry::instance();
  std::lock_guard<std::mutex> lk(r.m);
  r.peak_leased_bytes = r.leased_bytes;
}

/// Marks the end of a step of a repeating computation (the Trainer calls it after each training step). From the
/// first mark on, the cache keeps every size a step uses (a miss no longer gives idle buffers back), so a step that
/// repeats the previous one's shapes allocates nothing; and at each mark the buffers left idle through the whole
/// step just ended (initialisation temporaries, another phase's shapes) are given back.
inline void buffer_cache_step_boundary() {
  auto& reg = detail::cache_registry::instance();
  std::lock_guard<std::mutex> lk(reg.m);
  const std::uint64_t ended = reg.step++;  // buffers given back during it carry its number
  for (auto sweep : reg.sweepers) sweep(ended);
}

/// Frees every idle cached buffer (memory in use by live arrays is untouched).
inline void clear_buffer_cache() {
  auto& reg = detail::cache_registry::instance();
  std::lock_guard<std::mutex> lk(reg.m);
  for (auto clear : reg.clearers) clear();
}

namespace detail {
/// Tables the kernels read (offsets, RoPE tables, AdamW's chunk lists), made once per content and kept until the
/// buffer cache is emptied (clear_buffer_cache, which runs before Kokkos finalizes). A training step asks for the
/// same few every step, and each upload would cost a device synchronisation on a GPU. One memo per Tag, bounded:
/// past MaxEntries distinct keys it starts again (a table in use stays alive through its Views). Values are plain
/// Views made outside the buffer cache, so emptying the memo under the cache's lock never reaches the cache; `make`
/// runs without the memo's lock held, so it may use the buffer cache.
template <class Tag, class Key, class Value, std::size_t MaxEntries>
class content_memo {
 public:
  /// The value kept for `key`, made by `make()` the first time (and again after the memo is emptied).
  template <class Make>
  static Value get(const Key& key, Make&& make) {
    auto& self = instance();
    {
      std::lock_guard<std::mutex> lk(self.m_);
      if (const auto it = self.values_.find(key); it != self.values_.end()) return it->second;
    }
    Value v = make();
    std::lock_guard<std::mutex> lk(self.m_);
    if (self.values_.size() >= MaxEntries) self.values_.clear();
    self.values_.emplace(key, v);
    return v;
  }
  /// How many values are kept (for tests).
  static std::size_t size() {
    auto& self = instance();
    std::lock_guard<std::mutex> lk(self.m_);
    return self.values_.size();
  }

 private:
  static content_memo& instance() {
    static content_memo* memo = [] {
      auto* p = new content_memo();  // never destroyed: its Views are released by clear() before Kokkos finalizes
      auto& reg = cache_registry::instance();
      std::lock_guard<std::mutex> lk(reg.m);
      reg.clearers.push_back(&content_memo::clear);
      return p;
    }();
    return *memo;
  }
  static void clear() {
    auto& self = instance();
    std::lock_guard<std::mutex> lk(self.m_);
    self.values_.clear();
  }
  std::mutex m_;
  std::map<Key, Value> values_;
};
}  // namespace detail

// ---------------------------------------------------------------------------------------------------------
// Runtime

namespace detail {
/// glibc raises its mmap threshold (up to 32 MiB) each time a large block is freed, after which buffers of a
/// few MiB come from the heap and their memory is not returned when freed: the resident size then keeps the
/// high-water mark of every phase (measured: 297 MiB resident after a backward pass whose live data was
/// 85 MiB). Pinning the threshold keeps large buffers mmap'd, so freeing them gives the memory back; reuse of
/// hot sizes is the buffer cache's job. HALIAX_MMAP_THRESHOLD (bytes; default 1 MiB, 0 = leave glibc alone).
inline void configure_malloc() {
#if defined(__GLIBC__)
  static const bool done = [] {
    const char* env = std::getenv("HALIAX_MMAP_THRESHOLD");
    const long long bytes = env ? std::atoll(env) : (1LL << 20);
    if (bytes > 0) mallopt(M_MMAP_THRESHOLD, static_cast<int>(bytes));
    return true;
  }();
  (void)done;
#endif
}

/// Environment for Kokkos's own host threads (OpenMP backend), set before it initialises: its thread count
/// follows HALIAX_NUM_THREADS (which MPI launches set to the rank's share of the node) unless the user set
/// KOKKOS_NUM_THREADS or OMP_NUM_THREADS, so the ops' kernels and the pool's tasks use the same threads; and
/// OMP_PROC_BIND, when unset, is given libgomp's own default (false) explicitly, which is what Kokkos warns about
/// on every start otherwise. Serial builds read neither.
inline void prepare_kokkos_environment() {
#if defined(KOKKOS_ENABLE_OPENMP)
  const char* haliax_threads = std::getenv("HALIAX_NUM_THREADS");
  if (haliax_threads && !std::getenv("KOKKOS_NUM_THREADS") && !std::getenv("OMP_NUM_THREADS"))
    ::setenv("KOKKOS_NUM_THREADS", haliax_threads, 0);
  ::setenv("OMP_PROC_BIND", "false", 0);
#endif
}
}  // namespace detail

/// Initialises Kokkos for the lifetime of the object (and finalises it after). Programs may create one in
/// `main`; if none exists, the first allocation initialises Kokkos with default arguments.
class runtime {
 public:
  runtime() : runtime(0, nullptr) {}
  runtime(int argc, char** argv) {
    detail::configure_malloc();
    if (!Kokkos::is_initialized()) {
      detail::prepare_kokkos_environment();
      Kokkos::initialize(argc, argv);
      owner_ = true;
      detail::device_guard::install();
    }
  }
  runtime(const runtime&) = delete;
  runtime& operator=(const runtime&) = delete;
  ~runtime() {
    if (owner_ && Kokkos::is_initialized()) {
      clear_buffer_cache();
      Kokkos::finalize();
    }
  }

 private:
  bool owner_ = false;
};

/// Number of host threads haliax uses for its parallel work (GEMM row blocks). Defaults to
/// HALIAX_NUM_THREADS, else the hardware thread count. Results never depend on it.
inline int num_threads() { return detail::thread_pool::instance().size(); }

/// Sets the number of host threads (at least 1). Call it between ops, not from inside one.
inline void set_num_threads(int n) { detail::thread_pool::instance().resize(n); }

namespace detail {
inline void ensure_initialized() {
  if (!Kokkos::is_initialized()) {
    configure_malloc();
    prepare_kokkos_environment();
    // Kokkos 3.7 replaced InitArguments (gone in 4.x) by InitializationSettings.
#if KOKKOS_VERSION >= 30700
    Kokkos::initialize(Kokkos::InitializationSettings());
#else
    Kokkos::InitArguments args;
    Kokkos::initialize(args);
#endif
    device_guard::install();
  }
}
}  // namespace detail

// ---------------------------------------------------------------------------------------------------------
// Errors

/// Thrown when arrays that share an axis disagree on its size, or a size is impossible for an op.
/// The message names the op and prints both shapes by axis name.
class shape_error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// ---------------------------------------------------------------------------------------------------------
// The array

template <class T, class Axes>
class named_array;

namespace detail::ad {
template <class T, class Axes>
struct node;  // autodiff node (detail/ad.hpp)
}

namespace detail {
template <class Axes>
std::array<std::string_view, Axes::rank> axis_names() {
  return []<class... Tag>(mp::mp_list<Tag...>) {
    return std::array<std::string_view, sizeof...(Tag)>{Tag::name...};
  }(to_list<Axes>{});
}

template <std::size_t N>
std::string shape_string(const std::array<std::string_view, N>& names, const std::array<std::int64_t, N>& sizes) {
  std::string s = "{";
  for (std::size_t i = 0; i < N; ++i) {
    if (i) s += ", ";
    s += names[i];
    s += "=";
    s += std::to_string(sizes[i]);
  }
  return s + "}";
}
}  // namespace detail

/// A contiguous row-major array of `T` whose dimensions are the named axes `A...`, in that order.
/// Duplicate axes (or two axes with the same name) are a compile error (`axes` requires distinct names).
/// Copying shares the buffer.
template <class T, auto... A>
class named_array<T, axes<A...>> {
  static_assert(Element<T>, "haliax::named_array: element type must be float, double, bf16, int32_t or bool");

 public:
  using value_type = T;
  using axes_type = axes<A...>;
  using view_type = Kokkos::View<T*, memory_space>;
  static constexpr std::size_t rank = sizeof...(A);
  using shape_type = std::array<std::int64_t, rank>;

  /// An empty handle (no buffer); `valid()` is false.
  named_array() = default;
  named_array(const named_array&) = default;
  /// Leaves `o` an empty handle. (Written out: a Kokkos 3 View copies on move, so a member-wise move would
  /// leave `o` viewing the buffer without its lease, and the buffer would be freed instead of cached.)
  named_array(named_array&& o) noexcept
      : lease_(std::move(o.lease_)),
        data_(o.data_),
        sizes_(o.sizes_),
        ad_node_(std::move(o.ad_node_)),
        valid_(o.valid_) {
    o.data_ = view_type();
    o.valid_ = false;
  }
  ~named_array() = default;
  // Assignment lets go of the old buffer as the destructor does, view before lease, so that the lease sees the
  // buffer unviewed and returns it to the cache. (Member-wise assignment would drop the lease first while this
  // array still viewed the old buffer, and the buffer would be freed instead of cached.)
  named_array& operator=(const named_array& o) {
    if (this != &o) {
      named_array copy(o);
      swap(copy);
    }
    return *this;
  }
  named_array& operator=(named_array&& o) noexcept {
    if (this != &o) {
      named_array taken(std::move(o));
      swap(taken);
    }
    return *this;
  }
  void swap(named_array& o) noexcept {
    std::swap(lease_, o.lease_);
    std::swap(data_, o.data_);
    std::swap(sizes_, o.sizes_);
    std::swap(ad_node_, o.ad_node_);
    std::swap(valid_, o.valid_);
  }

  /// Wraps an existing contiguous buffer. Throws if the buffer is smaller than the sizes need. (An array carries
  /// no sharding: how a parameter tree is laid over ranks is decided per tree by levanter's distributed plan,
  /// docs/distributed.md; sizes are always this process's.)
  named_array(view_type data, shape_type sizes)
      : data_(std::move(data)), sizes_(sizes), valid_(true) {
    for (auto s : sizes_)
      if (s < 0) throw shape_error("haliax::named_array: negative axis size in " + shape_string());
    if (static_cast<std::int64_t>(data_.extent(0)) < element_count())
      throw shape_error("haliax::named_array: buffer of " + std::to_string(data_.extent(0)) +
                        " elements is too small for " + shape_string());
  }

  /// Wraps `data`, a view into the buffer `owner` holds (the whole of it, a part, or the same elements under other
  /// axes), and shares owner's lease on haliax's buffer cache: the buffer goes back to the cache when the last
  /// array over it is gone, instead of being freed because a wrapper outlived the array that leased it. A `data`
  /// outside owner's buffer (an op that had to copy) is wrapped alone.
  template <class OtherAxes>
  named_array(view_type data, shape_type sizes, const named_array<T, OtherAxes>& owner)
      : named_array(std::move(data), sizes) {
    const T* b = owner.data();
    const T* p = data_.data();
    if (owner.lease_ && b && p && p >= b && p < b + owner.view().extent(0)) lease_ = owner.lease_;
  }

  /// Allocates an uninitialised array of the given sizes (one per axis, in axis order).
  static named_array allocate(shape_type sizes, std::string_view label = "haliax::array") {
    detail::ensure_initialized();
    std::int64_t n = 1;
    for (auto s : sizes) {
      if (s < 0)
        throw shape_error(std::string(label) + ": negative axis size in " + detail::shape_string(axis_names(), sizes));
      n *= s;
    }
    auto lease = std::make_shared<detail::buffer_lease<T>>();
    lease->view = detail::buffer_cache<T>::acquire(static_cast<std::size_t>(n), std::string(label));
    named_array r(lease->view, sizes);
    r.lease_ = std::move(lease);
    return r;
  }

  bool valid() const { return valid_; }

  /// Number of elements (product of the sizes; 1 for a rank-0 array).
  std::int64_t element_count() const {
    std::int64_t n = 1;
    for (auto s : sizes_) n *= s;
    return n;
  }

  /// The run-time sizes, in axis order.
  const shape_type& sizes() const { return sizes_; }

  /// The size of one axis: `x.size(Embed)`.
  template <AxisTag Ax>
  requires detail::contains_v<detail::to_list<axes_type>, std::remove_cvref_t<Ax>> std::int64_t size(Ax)
  const { return sizes_[detail::index_of_v<detail::to_list<axes_type>, std::remove_cvref_t<Ax>>]; }

  /// The axis with its size, for creating arrays shaped like this one: `x.sized(Embed)` is `768 * Embed`.
  template <AxisTag Ax>
  requires detail::contains_v<detail::to_list<axes_type>, std::remove_cvref_t<Ax>> sized_axis<std::remove_cvref_t<Ax>>
  sized(Ax a)
  const { return {size(a)}; }

  /// Whether this array type has axis `Ax`.
  template <AxisTag Ax>
  static constexpr bool has_axis(Ax) {
    return detail::contains_v<detail::to_list<axes_type>, std::remove_cvref_t<Ax>>;
  }

  /// Axis names in order (upstream string names).
  static std::array<std::string_view, rank> axis_names() { return detail::axis_names<axes_type>(); }

  /// `{batch=4, embed=768}`.
  std::string shape_string() const { return detail::shape_string(axis_names(), sizes_); }

  /// Raw pointer to the first element (device memory when Kokkos runs on a device).
  T* data() const { return data_.data(); }
  const view_type& view() const { return data_; }

  /// Copies the elements to a host vector, row-major in axis order.
  std::vector<T> to_host() const {
    const auto n = static_cast<std::size_t>(element_count());
    if constexpr (std::is_same_v<T, bool>) {
      std::vector<unsigned char> bytes(n);
      copy_to(reinterpret_cast<bool*>(bytes.data()), n);
      return std::vector<bool>(bytes.begin(), bytes.end());
    } else {
      std::vector<T> out(n);
      copy_to(out.data(), n);
      return out;
    }
  }

  /// The single element of a rank-0 array.
  T item() const requires(rank == 0) { return to_host()[0]; }

  /// Autodiff bookkeeping (see haliax/autodiff.hpp): the node recording how this array was computed while a
  /// gradient is being taken; null otherwise. Ops read and set it; user code has no need to.
  const std::shared_ptr<detail::ad::node<T, axes<A...>>>& ad_node() const { return ad_node_; }
  void set_ad_node(std::shared_ptr<detail::ad::node<T, axes<A...>>> n) { ad_node_ = std::move(n); }

 private:
  template <class, class>
  friend class named_array;
  std::shared_ptr<detail::buffer_lease<T>> lease_;  // declared first: destroyed after data_
  view_type data_;
  shape_type sizes_{};
  std::shared_ptr<detail::ad::node<T, axes<A...>>> ad_node_;
  bool valid_ = false;

  void copy_to(T* host_ptr, std::size_t n) const {
    if (n == 0) return;
    Kokkos::View<T*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> host(host_ptr, n);
    Kokkos::deep_copy(host, Kokkos::subview(data_, std::pair<std::size_t, std::size_t>(0, n)));
  }
};

// ---------------------------------------------------------------------------------------------------------
// Axis concepts
//
// Each is defined over `axis_types<Tag...>` lists (axis.hpp) and ends in a one-parameter step whose argument
// is the offending axes, so that a failure names them: GCC 12 prints
//   the expression ‘is_same_v<Missing, haliax::axis_types<> > [with Missing = haliax::axis_types<Hidden>]’
//   evaluated to ‘false’
// where a concept over `axes<...>` would print `axes<{}, {}>`.

namespace detail {
template <class T, class Axes>
struct axis_types_of_impl<named_array<T, Axes>> {
  using type = typename axis_types_of_impl<Axes>::type;
};
}  // namespace detail

/// `Missing` is the empty list: the step of `HasAxes` that prints the missing axes.
template <class Missing>
concept NoMissingAxes = std::is_same_v<Missing, axis_types<>>;

/// `Present` is the empty list: the step of `LacksAxes` that prints the axes that should not be there.
template <class Present>
concept NoForbiddenAxes = std::is_same_v<Present, axis_types<>>;

/// Every axis of `Need` is an axis of `Have`. Each may be an `axis_types<...>`, an `axes<...>` or a
/// `named_array`; pass `axis_types` for the most readable notes.
///   static_assert(HasAxes<axis_types<Batch, Embed>, axis_types<Embed>>);
template <class Have, class Need>
concept HasAxes = NoMissingAxes<typename detail::missing_axes<Have, Need>::type>;

/// No axis of `Forbidden` is an axis of `Have` (same argument kinds as `HasAxes`).
///   static_assert(LacksAxes<axis_types<Batch, Embed>, axis_types<Mlp>>);
template <class Have, class Forbidden>
concept LacksAxes = NoForbiddenAxes<typename detail::present_axes<Have, Forbidden>::type>;

/// The tag type `Ax` is in the list `Have` (an `axis_types<...>`): the step of `AxisOf` that names both.
template <class Ax, class Have>
concept AxisIn = detail::contains_v<Have, Ax>;

/// `Ax` is one of the axes in the list `Axes` (e.g. `AxisOf<Embed, axes<Batch, Embed>>`).
template <class Ax, class Axes>
concept AxisOf = AxisTag<Ax> && AxisIn<std::remove_cvref_t<Ax>, axis_types_of<Axes>>;

/// Any `named_array`.
template <class T>
inline constexpr bool is_named_array_v = false;
template <class T, class Axes>
inline constexpr bool is_named_array_v<named_array<T, Axes>> = true;
template <class T>
concept NamedArray = is_named_array_v<std::remove_cvref_t<T>>;

/// The sized axes `S...` (`4 * Batch, 768 * Embed`) are distinct axes with distinct names.
template <class... S>
concept DistinctSizedAxes = DistinctAxisNames<typename std::remove_cvref_t<S>::axis_type...>;

/// `named_array<T, axes<...>>` from sized axes: the type `zeros<T>(s...)` returns.
template <class T, class... S>
using array_for = named_array<T, detail::to_axes<detail::mp::mp_list<typename std::remove_cvref_t<S>::axis_type...>>>;

namespace detail {

/// Throws `shape_error` unless two shapes (axis lists AxA/AxB with sizes) agree on the axes they share.
template <class AxA, class AxB, std::size_t NA, std::size_t NB>
void check_shared_sizes_raw(std::string_view op, const std::array<std::int64_t, NA>& sa,
                            const std::array<std::int64_t, NB>& sb) {
  using LA = to_list<AxA>;
  using LB = to_list<AxB>;
  mp::mp_for_each<intersection<LA, LB>>([&]<class Tag>(Tag) {
    constexpr auto ia = index_of_v<LA, Tag>;
    constexpr auto ib = index_of_v<LB, Tag>;
    if (sa[ia] != sb[ib]) {
      throw shape_error(std::string(op) + ": axis '" + std::string(Tag::name) + "' has size " + std::to_string(sa[ia]) +
                        " in " + shape_string(axis_names<AxA>(), sa) + " but " + std::to_string(sb[ib]) + " in " +
                        shape_string(axis_names<AxB>(), sb));
    }
  });
}

/// Throws `shape_error` unless `a` and `b` agree on the sizes of the axes they share.
template <class TA, class AxA, class TB, class AxB>
void check_shared_sizes(std::string_view op, const named_array<TA, AxA>& a, const named_array<TB, AxB>& b) {
  check_shared_sizes_raw<AxA, AxB>(op, a.sizes(), b.sizes());
}

template <class T>
KOKKOS_INLINE_FUNCTION T from_double(double v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v != 0.0;
  } else {
    return static_cast<T>(v);
  }
}

// Kernels live in functions whose template arguments are element types, never axis lists: nvcc names a device
// lambda by its enclosing function's signature, and cannot print `axes<Tag{}...>` arguments back as C++.
template <class T>
void fill_raw(const char* label, T* p, std::int64_t n, T value) {
  Kokkos::parallel_for(
      label, Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>(0, n), KOKKOS_LAMBDA(std::int64_t i) { p[i] = value; });
}

template <class T>
void arange_raw(T* p, std::int64_t n, T start, T step) {
  Kokkos::parallel_for(
      "haliax::arange", Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>(0, n), KOKKOS_LAMBDA(std::int64_t i) {
        p[i] = static_cast<T>(static_cast<compute_t<T>>(start) +
                              static_cast<compute_t<T>>(i) * static_cast<compute_t<T>>(step));
      });
}

template <class T, class Axes>
void fill(const named_array<T, Axes>& x, T value) {
  fill_raw<T>("haliax::fill", x.data(), x.element_count(), value);
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------------------
// Creation

/// An array of zeros: `zeros<float>(4 * Batch, 768 * Embed)`.
template <Element T = float, SizedAxis... S>
requires DistinctSizedAxes<S...>
array_for<T, S...> zeros(S... s) {
  auto x = array_for<T, S...>::allocate({s.size...}, "haliax::zeros");
  detail::fill(x, detail::from_double<T>(0.0));
  return x;
}

/// An array of ones.
template <Element T = float, SizedAxis... S>
requires DistinctSizedAxes<S...>
array_for<T, S...> ones(S... s) {
  auto x = array_for<T, S...>::allocate({s.size...}, "haliax::ones");
  detail::fill(x, detail::from_double<T>(1.0));
  return x;
}

/// An array filled with `value`.
template <Element T = float, SizedAxis... S>
requires DistinctSizedAxes<S...>
array_for<T, S...> full(T value, S... s) {
  auto x = array_for<T, S...>::allocate({s.size...}, "haliax::full");
  detail::fill(x, value);
  return x;
}

/// An uninitialised array (for outputs that are about to be overwritten).
template <Element T = float, SizedAxis... S>
requires DistinctSizedAxes<S...>
array_for<T, S...> empty(S... s) {
  return array_for<T, S...>::allocate({s.size...}, "haliax::empty");
}

/// Zeros with the axes and sizes of `x` (element type `U`, default the same).
template <class U = void, class T, class Axes>
auto zeros_like(const named_array<T, Axes>& x) {
  using R = std::conditional_t<std::is_void_v<U>, T, U>;
  auto r = named_array<R, Axes>::allocate(x.sizes(), "haliax::zeros_like");
  detail::fill(r, detail::from_double<R>(0.0));
  return r;
}

/// Ones with the axes and sizes of `x`.
template <class U = void, class T, class Axes>
auto ones_like(const named_array<T, Axes>& x) {
  using R = std::conditional_t<std::is_void_v<U>, T, U>;
  auto r = named_array<R, Axes>::allocate(x.sizes(), "haliax::ones_like");
  detail::fill(r, detail::from_double<R>(1.0));
  return r;
}

/// `value` everywhere, with the axes and sizes of `x`.
template <class T, class Axes>
named_array<T, Axes> full_like(const named_array<T, Axes>& x, T value) {
  auto r = named_array<T, Axes>::allocate(x.sizes(), "haliax::full_like");
  detail::fill(r, value);
  return r;
}

/// An uninitialised array shaped like `x`.
template <class U = void, class T, class Axes>
auto empty_like(const named_array<T, Axes>& x) {
  using R = std::conditional_t<std::is_void_v<U>, T, U>;
  return named_array<R, Axes>::allocate(x.sizes(), "haliax::empty_like");
}

/// `start, start + step, ...` along one axis: `arange(10 * Pos)` is 0..9 as int32;
/// `arange<float>(5 * X, 1.0f, 0.5f)` is 1, 1.5, ..., 3.
template <Element T = std::int32_t, AxisTag A>
array_for<T, sized_axis<A>> arange(sized_axis<A> s, T start = T(0), T step = T(1)) {
  // (array_for, not named_array<T, axes<A{}>>: nvcc mis-deduces the latter as an explicit template's result)
  auto x = array_for<T, sized_axis<A>>::allocate({s.size}, "haliax::arange");
  detail::arange_raw<T>(x.data(), s.size, start, step);
  return x;
}

/// An array holding a copy of host data given row-major in the order of the sized axes.
/// Throws `shape_error` if the number of values does not match the sizes.
template <Element T, SizedAxis... S>
requires DistinctSizedAxes<S...>
array_for<T, S...> from_host(std::span<const T> values, S... s) {
  auto x = array_for<T, S...>::allocate({s.size...}, "haliax::from_host");
  if (static_cast<std::int64_t>(values.size()) != x.element_count())
    throw shape_error("haliax::from_host: " + std::to_string(values.size()) + " values given for " + x.shape_string() +
                      " (" + std::to_string(x.element_count()) + " elements)");
  if (!values.empty()) {
    Kokkos::View<const T*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> host(values.data(),
                                                                                            values.size());
    Kokkos::deep_copy(x.view(), host);
  }
  return x;
}

/// What `with_host_elements` does with the elements around the call: fill the host buffer from the array first
/// (`read`), copy it back into the array after (`write`), or both.
enum class host_access { read, write, read_write };

/// Runs f(p), p pointing at n host elements that stand for a's elements [offset, offset + n) (row-major in axis
/// order): a's own memory where host code may touch it (a host build running its host kernels), else a host copy,
/// filled from `a` first unless `mode` is `write` and copied back into `a` afterwards unless it is `read`. Code
/// that moves elements between arrays and host-side buffers (collectives over MPI, tensor-parallel slicing) goes
/// through this, so it works on device memory too. `f` is called even when n is 0 (it may be a collective).
///   with_host_elements(grad, 0, n, host_access::read, [&](const float* p) { std::copy(p, p + n, buf); });
template <class T, class Axes, class F>
void with_host_elements(const named_array<T, Axes>& a, std::int64_t offset, std::int64_t n, host_access mode, F&& f) {
  static_assert(!std::is_same_v<T, bool>, "haliax::with_host_elements: not for bool arrays");
  if (offset < 0 || n < 0 || offset + n > a.element_count())
    throw shape_error("haliax::with_host_elements: elements [" + std::to_string(offset) + ", " +
                      std::to_string(offset + n) + ") of " + a.shape_string() + " (" +
                      std::to_string(a.element_count()) + " elements)");
  if (detail::host_reads_arrays()) {
    f(a.data() ? a.data() + offset : a.data());
    return;
  }
  std::vector<T> buf(static_cast<std::size_t>(n));
  if (n > 0) {
    Kokkos::View<T*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> host(buf.data(), buf.size());
    auto part = Kokkos::subview(a.view(), std::pair<std::size_t, std::size_t>(static_cast<std::size_t>(offset),
                                                                             static_cast<std::size_t>(offset + n)));
    if (mode != host_access::write) Kokkos::deep_copy(host, part);
    f(buf.data());
    if (mode != host_access::read) Kokkos::deep_copy(part, host);
  } else {
    f(buf.data());
  }
}

template <Element T, SizedAxis... S>
requires DistinctSizedAxes<S...>
array_for<T, S...> from_host(const std::vector<T>& values, S... s) {
  return from_host<T>(std::span<const T>(values.data(), values.size()), s...);
}

template <Element T, SizedAxis... S>
requires DistinctSizedAxes<S...>
array_for<T, S...> from_host(std::initializer_list<T> values, S... s) {
  return from_host<T>(std::span<const T>(values.begin(), values.size()), s...);
}

/// Bool arrays from host `std::vector<bool>` (which has no contiguous storage).
template <SizedAxis... S>
requires DistinctSizedAxes<S...>
array_for<bool, S...> from_host(const std::vector<bool>& values, S... s) {
  std::unique_ptr<bool[]> tmp(new bool[values.size() + 1]);
  for (std::size_t i = 0; i < values.size(); ++i) tmp[i] = values[i];
  return from_host<bool>(std::span<const bool>(tmp.get(), values.size()), s...);
}

/// A rank-0 array holding `value`.
template <Element T>
named_array<T, axes<>> scalar(T value) {
  return full<T>(value);
}

// `copy` and `astype` live in ops/elementwise.hpp, next to the autodiff machinery their gradients need.

}  // namespace haliax
