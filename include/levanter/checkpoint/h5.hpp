// levanter/checkpoint/h5.hpp: the HDF5 side of checkpoints. A `snapshot` is an in-memory copy of named
// datasets (taken on the training thread, so training can go on while it is written); `snapshot::write` puts it
// in one HDF5 file and fsyncs it. A `reader` reads datasets back into existing arrays, checking shapes and
// axis names.
//
// Layout: a dotted parameter path becomes nested groups (`transformer.blocks.stacked.attn.c_attn.weight` is the
// dataset `/transformer/blocks/stacked/attn/c_attn/weight`), row-major, little-endian, contiguous, no filters,
// so `h5dump`, h5py and any HDF5 reader can open it. Arrays of rank >= 1 carry an attribute `axes`: one UTF-8
// string per dimension, the haliax axis names.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <haliax/core.hpp>
#include <haliax/tree.hpp>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace levanter::checkpoint {

/// A checkpoint that cannot be written or read (missing, torn, corrupt, or not matching the model). The message
/// names the file or directory and what to do.
struct error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

namespace detail {

/// Uninitialised host memory for snapshots. Training waits while a snapshot is taken, and for a large model
/// that time goes mostly to zero-filling and page faults of fresh memory: large buffers skip the zeroing and ask
/// for transparent huge pages (2 MiB faults instead of 4 KiB ones).
class byte_buffer {
 public:
  byte_buffer() = default;
  explicit byte_buffer(std::size_t n);
  unsigned char* data() { return ptr_.get(); }
  const unsigned char* data() const { return ptr_.get(); }
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

 private:
  struct freer {
    void operator()(unsigned char* p) const { std::free(p); }
  };
  std::unique_ptr<unsigned char, freer> ptr_;
  std::size_t size_ = 0;
};

/// Owns an HDF5 identifier and closes it with the right function.
/// (HDF5's hid_t is std::int64_t and herr_t is int since 1.10; src/checkpoint/h5.cpp checks it.)
class h5id {
 public:
  using id_type = std::int64_t;
  using close_fn = int (*)(id_type);
  h5id() = default;
  h5id(id_type id, close_fn close) : id_(id), close_(close) {}
  h5id(const h5id&) = delete;
  h5id& operator=(const h5id&) = delete;
  h5id(h5id&& o) noexcept : id_(std::exchange(o.id_, invalid)), close_(o.close_) {}
  h5id& operator=(h5id&& o) noexcept {
    reset();
    id_ = std::exchange(o.id_, invalid);
    close_ = o.close_;
    return *this;
  }
  ~h5id() { reset(); }
  void reset() {
    if (id_ >= 0 && close_) close_(id_);
    id_ = invalid;
  }
  id_type get() const { return id_; }
  bool ok() const { return id_ >= 0; }

 private:
  static constexpr id_type invalid = -1;  // H5I_INVALID_HID
  id_type id_ = invalid;
  close_fn close_ = nullptr;
};

/// HDF5 prints its error stack to stderr by default; we report errors ourselves.
void quiet_hdf5();

enum class kind : int { f32, f64, i32, i64, u32, u8 };

std::size_t kind_size(kind k);

template <class T>
constexpr kind kind_of() {
  if constexpr (std::is_same_v<T, float>)
    return kind::f32;
  else if constexpr (std::is_same_v<T, double>)
    return kind::f64;
  else if constexpr (std::is_same_v<T, std::int32_t>)
    return kind::i32;
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return kind::i64;
  else if constexpr (std::is_same_v<T, std::uint32_t>)
    return kind::u32;
  else if constexpr (std::is_same_v<T, bool> || std::is_same_v<T, std::uint8_t> || std::is_same_v<T, char>)
    return kind::u8;
  else
    static_assert(sizeof(T) == 0, "levanter::checkpoint: unsupported element type");
}

/// `a.b.c` -> `/a/b/c`.
std::string h5_path(std::string_view dotted);

/// Raw bytes of an array's elements in host memory.
template <class T, class Axes>
byte_buffer host_bytes(const haliax::named_array<T, Axes>& a) {
  const auto n = static_cast<std::size_t>(a.element_count());
  byte_buffer bytes(n * sizeof(T));
  if (n == 0) return bytes;
  if (haliax::detail::host_reads_arrays()) {
    std::memcpy(bytes.data(), a.data(), bytes.size());
  } else {
    auto host = a.to_host();
    std::memcpy(bytes.data(), host.data(), bytes.size());
  }
  return bytes;
}

}  // namespace detail

/// An in-memory image of one HDF5 file: a list of datasets with their bytes.
class snapshot {
 public:
  struct dataset {
    std::string path;  ///< dotted
    detail::kind type;
    std::vector<std::int64_t> dims;  ///< empty: a scalar
    std::vector<std::string> axes;   ///< one per dimension, or empty
    detail::byte_buffer bytes;
  };

  /// Copies `a` (its bytes, sizes and axis names) under the dotted `path`.
  template <class T, class Axes>
  void add(const std::string& path, const haliax::named_array<T, Axes>& a) {
    dataset d{path, detail::kind_of<T>(), {}, {}, detail::host_bytes(a)};
    const auto names = haliax::named_array<T, Axes>::axis_names();
    for (std::size_t i = 0; i < names.size(); ++i) {
      d.dims.push_back(a.sizes()[i]);
      d.axes.emplace_back(names[i]);
    }
    push(std::move(d));
  }

  /// Copies every leaf of a reflected module under `prefix` (`prefix.transformer.ln_f.weight`, ...).
  template <class M>
  void add_tree(const std::string& prefix, const M& module) {
    haliax::tree::for_each_leaf(module, [&](const std::string& name, const auto& leaf) {
      add(prefix.empty() ? name : prefix + "." + name, leaf);
    });
  }

  template <class T>
  void add_scalar(const std::string& path, T value) {
    dataset d{path, detail::kind_of<T>(), {}, {}, detail::byte_buffer(sizeof(T))};
    std::memcpy(d.bytes.data(), &value, sizeof(T));
    push(std::move(d));
  }

  template <class T>
  void add_vector(const std::string& path, const std::vector<T>& values) {
    dataset d{path, detail::kind_of<T>(), {static_cast<std::int64_t>(values.size())}, {}, {}};
    d.bytes = detail::byte_buffer(values.size() * sizeof(T));
    if (!values.empty()) std::memcpy(d.bytes.data(), values.data(), d.bytes.size());
    push(std::move(d));
  }

  const std::vector<dataset>& datasets() const { return datasets_; }
  std::uint64_t bytes() const { return bytes_; }

  /// Writes the datasets to a new HDF5 file at `file_path` (truncating) and fsyncs it.
  void write(const std::string& file_path) const;

 private:
  void push(dataset d) {
    bytes_ += d.bytes.size();
    datasets_.push_back(std::move(d));
  }
  std::vector<dataset> datasets_;
  std::uint64_t bytes_ = 0;
};

/// Reads datasets of one HDF5 checkpoint file.
class reader {
 public:
  explicit reader(std::string file_path);

  const std::string& path() const { return path_; }

  /// Every dataset in the file, by dotted path, in the file's name order.
  std::vector<std::string> dataset_names() const;

  /// Whether the dotted `path` names a dataset.
  bool has(const std::string& dotted) const;

  /// The dimensions of a dataset (empty for a scalar).
  std::vector<std::int64_t> dims(const std::string& dotted) const;

  /// The `axes` attribute of a dataset (empty when it has none).
  std::vector<std::string> axes(const std::string& dotted) const;

  /// Reads `dotted` into the existing array `a`: the dataset's shape must equal `a`'s sizes, and its axis
  /// names (when stored) must equal `a`'s.
  template <class T, class Axes>
  void read_into(const std::string& dotted, haliax::named_array<T, Axes>& a) const {
    auto ds = open(dotted);
    const auto d = dims_of(ds.get(), dotted);
    const auto names = haliax::named_array<T, Axes>::axis_names();
    std::vector<std::int64_t> want(a.sizes().begin(), a.sizes().end());
    const auto stored_axes = axes_of(ds.get());
    std::vector<std::string> want_axes(names.begin(), names.end());
    if (!stored_axes.empty() && stored_axes != want_axes)
      throw error("'" + dotted + "' in '" + path_ + "' has axes " + join(stored_axes) + " but the model expects " +
                  join(want_axes) + " (a checkpoint of a different model?)");
    if (d != want)
      throw error("'" + dotted + "' in '" + path_ + "' has shape " + join(d) + " but the model expects " + join(want) +
                  " (a checkpoint of a different model size? check the model section of the config)");
    using E = std::conditional_t<std::is_same_v<T, bool>, std::uint8_t, T>;
    if (haliax::detail::host_reads_arrays()) {
      read_raw(ds.get(), dotted, detail::kind_of<E>(), a.data());
    } else {
      const auto n = static_cast<std::size_t>(a.element_count());
      std::vector<E> host(n);
      read_raw(ds.get(), dotted, detail::kind_of<E>(), host.data());
      Kokkos::View<T*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged> hv(reinterpret_cast<T*>(host.data()), n);
      Kokkos::deep_copy(Kokkos::subview(a.view(), Kokkos::make_pair(std::size_t{0}, n)), hv);
    }
  }

  /// Reads every leaf of `module` from `prefix.<leaf path>`. Missing leaves throw unless `allow_partial`, in
  /// which case they keep their current values and their names are returned.
  template <class M>
  std::vector<std::string> read_tree(const std::string& prefix, M& module, bool allow_partial = false) const {
    std::vector<std::string> missing;
    haliax::tree::for_each_leaf(module, [&](const std::string& name, auto& leaf) {
      const std::string p = prefix.empty() ? name : prefix + "." + name;
      if (!has(p)) {
        if (!allow_partial)
          throw error("'" + path_ + "' has no '" + p +
                      "' (an incomplete checkpoint or another model; set trainer.allow_partial_checkpoint: true to "
                      "keep freshly initialised values for missing parameters)");
        missing.push_back(p);
        return;
      }
      read_into(p, leaf);
    });
    return missing;
  }

  template <class T>
  T scalar(const std::string& dotted) const {
    auto ds = open(dotted);
    const auto d = dims_of(ds.get(), dotted);
    if (!d.empty()) throw error("'" + dotted + "' in '" + path_ + "' is not a scalar");
    T v{};
    read_raw(ds.get(), dotted, detail::kind_of<T>(), &v);
    return v;
  }

  template <class T>
  std::vector<T> vector(const std::string& dotted) const {
    auto ds = open(dotted);
    const auto d = dims_of(ds.get(), dotted);
    if (d.size() != 1) throw error("'" + dotted + "' in '" + path_ + "' is not a vector");
    std::vector<T> v(static_cast<std::size_t>(d[0]));
    if (!v.empty()) read_raw(ds.get(), dotted, detail::kind_of<T>(), v.data());
    return v;
  }

 private:
  detail::h5id open(const std::string& dotted) const;
  std::vector<std::int64_t> dims_of(detail::h5id::id_type ds, const std::string& dotted) const;
  static std::vector<std::string> axes_of(detail::h5id::id_type ds);
  void read_raw(detail::h5id::id_type ds, const std::string& dotted, detail::kind k, void* dst) const;
  static std::string join(const std::vector<std::int64_t>& v);
  static std::string join(const std::vector<std::string>& v);

  std::string path_;
  detail::h5id file_;
};

}  // namespace levanter::checkpoint
