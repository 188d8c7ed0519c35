// levanter/distributed/comm.hpp: the deterministic float collectives over any communicator (what the optimizer's
// sharded paths call; world() and the local backend are in comm.cpp).
#include <levanter/distributed/comm.hpp>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace levanter::distributed {

std::vector<std::int64_t> even_bounds(std::int64_t n, int parts, std::int64_t align) {
  if (parts < 1) throw std::invalid_argument("even_bounds: parts must be >= 1");
  align = std::max<std::int64_t>(align, 1);
  std::vector<std::int64_t> b(static_cast<std::size_t>(parts) + 1, 0);
  for (int r = 1; r < parts; ++r) {
    const std::int64_t ideal = n / parts * r + (n % parts) * r / parts;
    std::int64_t x = (ideal + align / 2) / align * align;
    b[static_cast<std::size_t>(r)] = std::clamp(x, b[static_cast<std::size_t>(r) - 1], n);
  }
  b.back() = n;
  return b;
}

namespace {
void check_bounds(const communicator& c, const std::vector<std::int64_t>& bounds, const char* what) {
  if (bounds.size() != static_cast<std::size_t>(c.size()) + 1)
    throw std::invalid_argument(std::string(what) + ": " + std::to_string(bounds.size()) + " bounds for " +
                                std::to_string(c.size()) + " ranks");
  for (std::size_t i = 1; i < bounds.size(); ++i)
    if (bounds[i] < bounds[i - 1] || bounds[0] != 0)
      throw std::invalid_argument(std::string(what) + ": bounds are not increasing from 0");
}
}  // namespace

void reduce_scatter_sum(communicator& c, float* data, const std::vector<std::int64_t>& bounds) {
  check_bounds(c, bounds, "reduce_scatter_sum");
  const int n = c.size(), r = c.rank();
  if (n == 1) return;
  const std::int64_t lo = bounds[static_cast<std::size_t>(r)], len = bounds[static_cast<std::size_t>(r) + 1] - lo;
  std::vector<float> recv(static_cast<std::size_t>(len) * static_cast<std::size_t>(n));
  std::vector<std::size_t> sc(n), sd(n), rc(n), rd(n);
  for (int q = 0; q < n; ++q) {
    sc[q] = static_cast<std::size_t>(bounds[q + 1] - bounds[q]) * 4;
    sd[q] = static_cast<std::size_t>(bounds[q]) * 4;
    rc[q] = static_cast<std::size_t>(len) * 4;
    rd[q] = static_cast<std::size_t>(q) * static_cast<std::size_t>(len) * 4;
  }
  c.alltoallv(data, sc, sd, recv.data(), rc, rd);
  // The ranks' contributions added along tree_order's tree, in place in recv (slice q holds rank q's part).
  auto slice = [&](int q) { return recv.data() + static_cast<std::size_t>(q) * static_cast<std::size_t>(len); };
  tree_order(n, [&](int into, int from) {
    float* a = slice(into);
    const float* b = slice(from);
    for (std::int64_t i = 0; i < len; ++i) a[i] += b[i];
  });
  std::copy(slice(0), slice(0) + len, data + lo);
}

void allgather_ranges(communicator& c, float* data, const std::vector<std::int64_t>& bounds) {
  check_bounds(c, bounds, "allgather_ranges");
  const int n = c.size(), r = c.rank();
  if (n == 1) return;
  std::vector<std::size_t> counts(n), displs(n);
  for (int q = 0; q < n; ++q) {
    counts[q] = static_cast<std::size_t>(bounds[q + 1] - bounds[q]) * 4;
    displs[q] = static_cast<std::size_t>(bounds[q]) * 4;
  }
  c.allgatherv(data + bounds[static_cast<std::size_t>(r)], data, counts, displs);
}

void allreduce_sum(communicator& c, float* data, std::int64_t n) {
  if (c.size() == 1) return;
  const auto b = even_bounds(n, c.size(), 16);
  reduce_scatter_sum(c, data, b);
  allgather_ranges(c, data, b);
}

std::vector<double> allgather_doubles(communicator& c, const std::vector<double>& mine) {
  const int n = c.size();
  if (n == 1) return mine;
  std::vector<std::int64_t> lens(n);
  const std::int64_t my = static_cast<std::int64_t>(mine.size());
  std::vector<std::size_t> ic(n, 8), id(n);
  for (int q = 0; q < n; ++q) id[q] = static_cast<std::size_t>(q) * 8;
  c.allgatherv(&my, lens.data(), ic, id);
  std::vector<std::size_t> counts(n), displs(n);
  std::size_t total = 0;
  for (int q = 0; q < n; ++q) {
    counts[q] = static_cast<std::size_t>(lens[q]) * 8;
    displs[q] = total;
    total += counts[q];
  }
  std::vector<double> out(total / 8);
  c.allgatherv(mine.data(), out.data(), counts, displs);
  return out;
}

double allreduce_sum(communicator& c, double x) {
  if (c.size() == 1) return x;
  auto all = allgather_doubles(c, {x});
  tree_order(c.size(), [&](int into, int from) { all[static_cast<std::size_t>(into)] += all[static_cast<std::size_t>(from)]; });
  return all[0];
}

std::string broadcast_string(communicator& c, const std::string& s, int root) {
  if (c.size() == 1) return s;
  std::uint64_t len = s.size();
  c.broadcast(&len, sizeof len, root);
  std::string out = c.rank() == root ? s : std::string(len, '\0');
  if (len) c.broadcast(out.data(), len, root);
  return out;
}

bool broadcast_flag(communicator& c, bool b, int root) {
  if (c.size() == 1) return b;
  std::uint8_t v = b ? 1 : 0;
  c.broadcast(&v, 1, root);
  return v != 0;
}

}  // namespace levanter::distributed
