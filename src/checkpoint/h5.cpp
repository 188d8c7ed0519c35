// checkpoint/h5.hpp: HDF5 files of checkpoints (snapshot::write, reader).
#include <fcntl.h>
#include <hdf5.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <levanter/checkpoint/h5.hpp>
#include <type_traits>

namespace levanter::checkpoint {

static_assert(std::is_same_v<hid_t, detail::h5id::id_type>, "h5id::id_type must be HDF5's hid_t");
static_assert(std::is_same_v<herr_t, int>, "h5id::close_fn must match HDF5's close functions");

namespace detail {

byte_buffer::byte_buffer(std::size_t n) : size_(n) {
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

// HDF5 keeps a file whose write failed (a full disk) open, and its exit handler then crashes trying to flush it
// again; every file of ours is closed by its owner, so the exit handler has nothing to do and is not registered.
// Must run before the library initialises, i.e. before main.
const bool hdf5_without_exit_handler = [] {
  H5dont_atexit();
  return true;
}();

// Errors become exceptions with our messages; HDF5's own error stack print is off. The setting is per thread in a
// thread-safe HDF5, and checkpoints are written from a background thread, so every thread sets it once.
void quiet_hdf5() {
  thread_local const bool done = [] {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)done;
  (void)hdf5_without_exit_handler;
}

hid_t file_type(kind k) {
  switch (k) {
    case kind::f32:
      return H5T_IEEE_F32LE;
    case kind::f64:
      return H5T_IEEE_F64LE;
    case kind::i32:
      return H5T_STD_I32LE;
    case kind::i64:
      return H5T_STD_I64LE;
    case kind::u32:
      return H5T_STD_U32LE;
    case kind::u8:
      return H5T_STD_U8LE;
  }
  return H5T_STD_U8LE;
}

hid_t memory_type(kind k) {
  switch (k) {
    case kind::f32:
      return H5T_NATIVE_FLOAT;
    case kind::f64:
      return H5T_NATIVE_DOUBLE;
    case kind::i32:
      return H5T_NATIVE_INT32;
    case kind::i64:
      return H5T_NATIVE_INT64;
    case kind::u32:
      return H5T_NATIVE_UINT32;
    case kind::u8:
      return H5T_NATIVE_UINT8;
  }
  return H5T_NATIVE_UINT8;
}

std::size_t kind_size(kind k) {
  switch (k) {
    case kind::f32:
    case kind::i32:
    case kind::u32:
      return 4;
    case kind::f64:
    case kind::i64:
      return 8;
    case kind::u8:
      return 1;
  }
  return 1;
}

std::string h5_path(std::string_view dotted) {
  std::string p = "/";
  for (char c : dotted) p.push_back(c == '.' ? '/' : c);
  return p;
}

}  // namespace detail

void snapshot::write(const std::string& file_path) const {
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
    h5id space(
        d.dims.empty() ? H5Screate(H5S_SCALAR) : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
        H5Sclose);
    const std::string p = detail::h5_path(d.path);
    h5id ds(
        H5Dcreate2(file.get(), p.c_str(), detail::file_type(d.type), space.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT),
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

reader::reader(std::string file_path) : path_(std::move(file_path)) {
  detail::quiet_hdf5();
  file_ = detail::h5id(H5Fopen(path_.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file_.ok()) throw error("cannot open '" + path_ + "': missing, truncated or not an HDF5 file");
}

std::vector<std::string> reader::dataset_names() const {
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

bool reader::has(const std::string& dotted) const {
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

std::vector<std::int64_t> reader::dims(const std::string& dotted) const {
  auto ds = open(dotted);
  return dims_of(ds.get(), dotted);
}

std::vector<std::string> reader::axes(const std::string& dotted) const {
  auto ds = open(dotted);
  return axes_of(ds.get());
}

detail::h5id reader::open(const std::string& dotted) const {
  if (!has(dotted)) throw error("'" + path_ + "' has no dataset '" + dotted + "'");
  const std::string p = detail::h5_path(dotted);
  detail::h5id ds(H5Dopen2(file_.get(), p.c_str(), H5P_DEFAULT), H5Dclose);
  if (!ds.ok()) throw error("cannot open dataset '" + dotted + "' in '" + path_ + "' (corrupt file?)");
  return ds;
}

std::vector<std::int64_t> reader::dims_of(hid_t ds, const std::string& dotted) const {
  detail::h5id space(H5Dget_space(ds), H5Sclose);
  const int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank < 0) throw error("cannot read the shape of '" + dotted + "' in '" + path_ + "' (corrupt file?)");
  std::vector<hsize_t> h(static_cast<std::size_t>(rank));
  if (rank > 0) H5Sget_simple_extent_dims(space.get(), h.data(), nullptr);
  return std::vector<std::int64_t>(h.begin(), h.end());
}

std::vector<std::string> reader::axes_of(hid_t ds) {
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

void reader::read_raw(hid_t ds, const std::string& dotted, detail::kind k, void* dst) const {
  if (H5Dread(ds, detail::memory_type(k), H5S_ALL, H5S_ALL, H5P_DEFAULT, dst) < 0)
    throw error("reading '" + dotted + "' from '" + path_ + "' failed (truncated or corrupt file)");
}

std::string reader::join(const std::vector<std::int64_t>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(v[i]);
  }
  return s + "]";
}

std::string reader::join(const std::vector<std::string>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i) s += ", ";
    s += v[i];
  }
  return s + "]";
}

}  // namespace levanter::checkpoint
