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

#include <hdf5.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <haliax/core.hpp>
#include <haliax/tree.hpp>

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
  explicit byte_buffer(std::size_t n) : size_(n) {
    if (n == 0) return;
    constexpr std::size_t huge = std::size_t{2} << 20;
    void* p = nullptr;
    if (n >= 2 * huge) {
      const std::size_t rounded = (n + huge - 1) / huge * huge;
      p = std::aligned_alloc(huge, rounded);
      if (p) ::madvise(p, rounded, MADV_HUGEPAGE);
    } else {
      p = std::malloc(n);
    }
    if (!p) throw std::bad_alloc();
    ptr_.reset(static_cast<unsigned char*>(p));
  }
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
class h5id {
 public:
  h5id() = default;
  h5id(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  h5id(const h5id&) = delete;
  h5id& operator=(const h5id&) = delete;
  h5id(h5id&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)), close_(o.close_) {}
  h5id& operator=(h5id&& o) noexcept {
    reset();
    id_ = std::exchange(o.id_, H5I_INVALID_HID);
    close_ = o.close_;
    return *this;
  }
  ~h5id() { reset(); }
  void reset() {
    if (id_ >= 0 && close_) close_(id_);
    id_ = H5I_INVALID_HID;
  }
  hid_t get() const { return id_; }
  bool ok() const { return id_ >= 0; }

 private:
  hid_t id_ = H5I_INVALID_HID;
  herr_t (*close_)(hid_t) = nullptr;
};

/// HDF5 prints its error stack to stderr by default; we report errors ourselves.
inline void quiet_hdf5() {
  static const bool done = [] {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)done;
}

enum class kind : int { f32, f64, i32, i64, u32, u8 };

inline hid_t file_type(kind k) {
  switch (k) {
    case kind::f32: return H5T_IEEE_F32LE;
    case kind::f64: return H5T_IEEE_F64LE;
    case kind::i32: return H5T_STD_I32LE;
    case kind::i64: return H5T_STD_I64LE;
    case kind::u32: return H5T_STD_U32LE;
    case kind::u8: return H5T_STD_U8LE;
  }
  return H5T_STD_U8LE;
}
inline hid_t memory_type(kind k) {
  switch (k) {
    case kind::f32: return H5T_NATIVE_FLOAT;
    case kind::f64: return H5T_NATIVE_DOUBLE;
    case kind::i32: return H5T_NATIVE_INT32;
    case kind::i64: return H5T_NATIVE_INT64;
    case kind::u32: return H5T_NATIVE_UINT32;
    case kind::u8: return H5T_NATIVE_UINT8;
  }
  return H5T_NATIVE_UINT8;
}
inline std::size_t kind_size(kind k) {
  switch (k) {
    case kind::f32: case kind::i32: case kind::u32: return 4;
    case kind::f64: case kind::i64: return 8;
    case kind::u8: return 1;
  }
  return 1;
}

template <class T>
constexpr kind kind_of() {
  if constexpr (std::is_same_v<T, float>) return kind::f32;
  else if constexpr (std::is_same_v<T, double>) return kind::f64;
  else if constexpr (std::is_same_v<T, std::int32_t>) return kind::i32;
  else if constexpr (std::is_same_v<T, std::int64_t>) return kind::i64;
  else if constexpr (std::is_same_v<T, std::uint32_t>) return kind::u32;
  else if constexpr (std::is_same_v<T, bool> || std::is_same_v<T, std::uint8_t> || std::is_same_v<T, char>) return kind::u8;
  else static_assert(sizeof(T) == 0, "levanter::checkpoint: unsupported element type");
}

/// `a.b.c` -> `/a/b/c`.
inline std::string h5_path(std::string_view dotted) {
  std::string p = "/";
  for (char c : dotted) p.push_back(c == '.' ? '/' : c);
  return p;
}

/// Raw bytes of an array's elements in host memory.
template <class T, class Axes>
byte_buffer host_bytes(const haliax::named_array<T, Axes>& a) {
  const auto n = static_cast<std::size_t>(a.element_count());
  byte_buffer bytes(n * sizeof(T));
  if (n == 0) return bytes;
  if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, haliax::memory_space>::accessible) {
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
  void write(const std::string& file_path) const {
    using detail::h5id;
    detail::quiet_hdf5();
    h5id file(H5Fcreate(file_path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
    if (!file.ok()) throw error("cannot create HDF5 file '" + file_path + "' (is the directory writable?)");
    h5id lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
    H5Pset_create_intermediate_group(lcpl.get(), 1);
    h5id dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    H5Pset_obj_track_times(dcpl.get(), 0);  // no modification times: the same state gives the same bytes
    h5id str_type(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(str_type.get(), H5T_VARIABLE);
    H5Tset_cset(str_type.get(), H5T_CSET_UTF8);
    for (const auto& d : datasets_) {
      std::vector<hsize_t> dims(d.dims.begin(), d.dims.end());
      h5id space(d.dims.empty() ? H5Screate(H5S_SCALAR)
                                : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                 H5Sclose);
      const std::string p = detail::h5_path(d.path);
      h5id ds(H5Dcreate2(file.get(), p.c_str(), detail::file_type(d.type), space.get(), lcpl.get(), dcpl.get(),
                         H5P_DEFAULT),
              H5Dclose);
      if (!ds.ok()) throw error("cannot create dataset '" + p + "' in '" + file_path + "'");
      if (!d.bytes.empty() &&
          H5Dwrite(ds.get(), detail::memory_type(d.type), H5S_ALL, H5S_ALL, H5P_DEFAULT, d.bytes.data()) < 0)
        throw error("writing dataset '" + p + "' to '" + file_path + "' failed (disk full?)");
      if (!d.axes.empty()) {
        const hsize_t n = d.axes.size();
        h5id aspace(H5Screate_simple(1, &n, nullptr), H5Sclose);
        h5id attr(H5Acreate2(ds.get(), "axes", str_type.get(), aspace.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
        std::vector<const char*> ptrs;
        for (const auto& a : d.axes) ptrs.push_back(a.c_str());
        if (!attr.ok() || H5Awrite(attr.get(), str_type.get(), ptrs.data()) < 0)
          throw error("writing the axes of '" + p + "' to '" + file_path + "' failed");
      }
    }
    if (H5Fflush(file.get(), H5F_SCOPE_GLOBAL) < 0) throw error("flushing '" + file_path + "' failed (disk full?)");
    file.reset();
    const int fd = ::open(file_path.c_str(), O_RDONLY);
    if (fd < 0 || ::fsync(fd) != 0) {
      if (fd >= 0) ::close(fd);
      throw error("cannot fsync '" + file_path + "'");
    }
    ::close(fd);
  }

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
  explicit reader(std::string file_path) : path_(std::move(file_path)) {
    detail::quiet_hdf5();
    file_ = detail::h5id(H5Fopen(path_.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    if (!file_.ok()) throw error("cannot open '" + path_ + "': missing, truncated or not an HDF5 file");
  }

  const std::string& path() const { return path_; }

  /// Every dataset in the file, by dotted path, in the file's name order.
  std::vector<std::string> dataset_names() const {
    struct ctx {
      hid_t file;
      std::vector<std::string> names;
    } c{file_.get(), {}};
#if H5_VERSION_GE(1, 12, 0)
    auto visit = [](hid_t, const char* name, const H5L_info2_t*, void* data) -> herr_t {
#else
    auto visit = [](hid_t, const char* name, const H5L_info_t*, void* data) -> herr_t {
#endif
      auto* cx = static_cast<ctx*>(data);
      H5O_type_t type = H5O_TYPE_UNKNOWN;
      const hid_t obj = H5Oopen(cx->file, name, H5P_DEFAULT);
      if (obj >= 0) {
        type = H5Iget_type(obj) == H5I_DATASET ? H5O_TYPE_DATASET : H5O_TYPE_GROUP;
        H5Oclose(obj);
      }
      if (type == H5O_TYPE_DATASET) {
        std::string dotted(name);
        for (auto& ch : dotted)
          if (ch == '/') ch = '.';
        cx->names.push_back(std::move(dotted));
      }
      return 0;
    };
    if (H5Lvisit(file_.get(), H5_INDEX_NAME, H5_ITER_INC, visit, &c) < 0)
      throw error("cannot list the datasets of '" + path_ + "'");
    return c.names;
  }

  /// Whether the dotted `path` names a dataset.
  bool has(const std::string& dotted) const {
    const std::string p = detail::h5_path(dotted);
    // H5Lexists needs every intermediate group to exist; walk the path.
    std::size_t pos = 1;
    while (true) {
      const auto next = p.find('/', pos);
      const std::string prefix = p.substr(0, next);
      if (H5Lexists(file_.get(), prefix.c_str(), H5P_DEFAULT) <= 0) return false;
      if (next == std::string::npos) break;
      pos = next + 1;
    }
    detail::h5id obj(H5Oopen(file_.get(), p.c_str(), H5P_DEFAULT), H5Oclose);
    return obj.ok() && H5Iget_type(obj.get()) == H5I_DATASET;
  }

  /// The dimensions of a dataset (empty for a scalar).
  std::vector<std::int64_t> dims(const std::string& dotted) const {
    auto ds = open(dotted);
    return dims_of(ds.get(), dotted);
  }

  /// The `axes` attribute of a dataset (empty when it has none).
  std::vector<std::string> axes(const std::string& dotted) const {
    auto ds = open(dotted);
    return axes_of(ds.get());
  }

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
      throw error("'" + dotted + "' in '" + path_ + "' has shape " + join(d) + " but the model expects " +
                  join(want) + " (a checkpoint of a different model size? check the model section of the config)");
    using E = std::conditional_t<std::is_same_v<T, bool>, std::uint8_t, T>;
    if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, haliax::memory_space>::accessible) {
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
  detail::h5id open(const std::string& dotted) const {
    if (!has(dotted)) throw error("'" + path_ + "' has no dataset '" + dotted + "'");
    const std::string p = detail::h5_path(dotted);
    detail::h5id ds(H5Dopen2(file_.get(), p.c_str(), H5P_DEFAULT), H5Dclose);
    if (!ds.ok()) throw error("cannot open dataset '" + dotted + "' in '" + path_ + "' (corrupt file?)");
    return ds;
  }
  std::vector<std::int64_t> dims_of(hid_t ds, const std::string& dotted) const {
    detail::h5id space(H5Dget_space(ds), H5Sclose);
    const int rank = H5Sget_simple_extent_ndims(space.get());
    if (rank < 0) throw error("cannot read the shape of '" + dotted + "' in '" + path_ + "' (corrupt file?)");
    std::vector<hsize_t> h(static_cast<std::size_t>(rank));
    if (rank > 0) H5Sget_simple_extent_dims(space.get(), h.data(), nullptr);
    return std::vector<std::int64_t>(h.begin(), h.end());
  }
  static std::vector<std::string> axes_of(hid_t ds) {
    std::vector<std::string> out;
    if (H5Aexists(ds, "axes") <= 0) return out;
    detail::h5id attr(H5Aopen(ds, "axes", H5P_DEFAULT), H5Aclose);
    detail::h5id space(H5Aget_space(attr.get()), H5Sclose);
    const hssize_t n = H5Sget_simple_extent_npoints(space.get());
    if (n <= 0) return out;
    detail::h5id type(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(type.get(), H5T_VARIABLE);
    H5Tset_cset(type.get(), H5T_CSET_UTF8);
    std::vector<char*> ptrs(static_cast<std::size_t>(n), nullptr);
    if (H5Aread(attr.get(), type.get(), ptrs.data()) < 0) return out;
    for (char* p : ptrs) out.emplace_back(p ? p : "");
    H5Dvlen_reclaim(type.get(), space.get(), H5P_DEFAULT, ptrs.data());
    return out;
  }
  void read_raw(hid_t ds, const std::string& dotted, detail::kind k, void* dst) const {
    if (H5Dread(ds, detail::memory_type(k), H5S_ALL, H5S_ALL, H5P_DEFAULT, dst) < 0)
      throw error("reading '" + dotted + "' from '" + path_ + "' failed (truncated or corrupt file)");
  }
  template <class V>
  static std::string join(const std::vector<V>& v) {
    std::string s = "[";
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (i) s += ", ";
      if constexpr (std::is_same_v<V, std::string>) s += v[i];
      else s += std::to_string(v[i]);
    }
    return s + "]";
  }

  std::string path_;
  detail::h5id file_;
};

}  // namespace levanter::checkpoint
