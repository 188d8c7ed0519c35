// Reads datasets and attributes of the golden HDF5 files made by tests/oracle/*.py (HDF5 C API).
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace h5golden {

class file {
 public:
  explicit file(const std::string& path) : id_(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT)) {
    if (id_ < 0) throw std::runtime_error("cannot open HDF5 file " + path);
  }
  ~file() { H5Fclose(id_); }
  file(const file&) = delete;
  file& operator=(const file&) = delete;

  bool has(const std::string& name) const { return H5Lexists(id_, name.c_str(), H5P_DEFAULT) > 0; }

  /// A dataset's values as float (any numeric type) and its dimensions.
  std::vector<float> floats(const std::string& name, std::vector<std::int64_t>* dims = nullptr) const {
    return read<float>(name, H5T_NATIVE_FLOAT, dims);
  }
  std::vector<std::int32_t> ints(const std::string& name, std::vector<std::int64_t>* dims = nullptr) const {
    return read<std::int32_t>(name, H5T_NATIVE_INT32, dims);
  }
  /// A numeric attribute of the root group.
  double attr(const std::string& name) const {
    hid_t a = H5Aopen(id_, name.c_str(), H5P_DEFAULT);
    if (a < 0) throw std::runtime_error("no attribute " + name);
    double v = 0;
    H5Aread(a, H5T_NATIVE_DOUBLE, &v);
    H5Aclose(a);
    return v;
  }

 private:
  template <class T>
  std::vector<T> read(const std::string& name, hid_t type, std::vector<std::int64_t>* dims) const {
    hid_t d = H5Dopen2(id_, name.c_str(), H5P_DEFAULT);
    if (d < 0) throw std::runtime_error("no dataset " + name);
    hid_t s = H5Dget_space(d);
    const int rank = H5Sget_simple_extent_ndims(s);
    std::vector<hsize_t> h(static_cast<std::size_t>(rank));
    H5Sget_simple_extent_dims(s, h.data(), nullptr);
    std::size_t n = 1;
    if (dims) dims->clear();
    for (auto x : h) {
      n *= x;
      if (dims) dims->push_back(static_cast<std::int64_t>(x));
    }
    std::vector<T> out(n);
    if (H5Dread(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) < 0) throw std::runtime_error("cannot read " + name);
    H5Sclose(s);
    H5Dclose(d);
    return out;
  }
  hid_t id_;
};

}  // namespace h5golden
