// The optimizers whose state is not shaped like the parameters: SOAP (Adam in the eigenbasis of Shampoo's
// preconditioners) and PSGD Kron (Kronecker-factored preconditioners fitted to random probes). Both see each leaf as
// upstream does (src/levanter/optim/soap.py, kron.py): per layer of a Stacked leaf, its dimensions merged into
// contiguous groups (merge_small_dims), then cut into blocks of at most block_size along the dimensions that get a
// matrix and zero-padded to multiples of block_size (partition_grads_into_blocks). Each block has one factor per
// dimension. The engine (levanter/optim/rule.hpp) hands the leaf work the whole clipped gradient of a leaf and keeps
// the factors as the leaf's own state.
//
// The products go through haliax's deterministic host GEMM; eigh and QR (SOAP) through LAPACK in double precision.
#include <levanter/optim/rule.hpp>
#include <levanter/optim/rules.hpp>

#include <haliax/detail/gemm.hpp>
#include <haliax/detail/random_dists.hpp>
#include <haliax/detail/thread_pool.hpp>
#include <haliax/detail/threefry.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#if defined(HALIAX_HAVE_HOST_BLAS)
extern "C" {
void dsyevd_(const char* jobz, const char* uplo, const int* n, double* a, const int* lda, double* w, double* work,
             const int* lwork, int* iwork, const int* liwork, int* info);
void dgeqrf_(const int* m, const int* n, double* a, const int* lda, double* tau, double* work, const int* lwork,
             int* info);
void dorgqr_(const int* m, const int* n, const int* k, double* a, const int* lda, const double* tau, double* work,
             const int* lwork, int* info);
}
#endif

namespace levanter::optim {
namespace {

namespace tf = haliax::detail::threefry;

// ---- How a leaf is seen -------------------------------------------------------------------------------------------

// upstream's dim2loss: the cost of a merged dimension of size d against the target size t0.
double dim2loss(double d, double t0) {
  double loss = 0;
  if (d < t0) {
    loss += std::log2(t0 / d);
    if (d < t0 / 8) loss += 100 * std::log2(t0 / 8 / d);
  } else {
    loss += 10 * std::log2(d / t0);
    if (d > 8 * t0) loss += 1000 * std::log2(d / (8 * t0));
  }
  return loss;
}

// upstream's _merge_small_dims: the split of `dims` into contiguous groups of least total dim2loss (the first found
// in upstream's order: first group of length 1, 2, ...), each group's flag true when all its dims' are.
void merge_small_dims(std::vector<int64_t>& dims, std::vector<bool>& flag, double target) {
  if (std::all_of(dims.begin(), dims.end(), [](int64_t d) { return d == 1; })) {
    dims = {1};
    flag = {true};
    return;
  }
  const std::size_t k = dims.size();
  double best = std::numeric_limits<double>::infinity();
  std::vector<std::size_t> best_cut, cut;  // group lengths
  std::function<void(std::size_t, double)> walk = [&](std::size_t from, double loss) {
    if (from == k) {
      if (loss < best) {
        best = loss;
        best_cut = cut;
      }
      return;
    }
    double prod = 1;
    for (std::size_t i = from; i < k; ++i) {
      prod *= static_cast<double>(dims[i]);
      cut.push_back(i - from + 1);
      walk(i + 1, loss + dim2loss(prod, target));
      cut.pop_back();
    }
  };
  walk(0, 0.0);
  std::vector<int64_t> md;
  std::vector<bool> mf;
  std::size_t at = 0;
  for (std::size_t len : best_cut) {
    int64_t d = 1;
    bool f = true;
    for (std::size_t i = at; i < at + len; ++i) {
      d *= dims[i];
      f = f && flag[i];
    }
    md.push_back(d);
    mf.push_back(f);
    at += len;
  }
  dims = std::move(md);
  flag = std::move(mf);
}

// One leaf per layer: merged dims, which of them have no matrix (`flag`: Kron's diagonal, SOAP's none), and the
// blocks (upstream's BlockPartitioner: a dim with a matrix longer than block_size is cut into pieces of block_size;
// with partitioning every dim of every block is padded to a multiple of block_size).
struct leaf_plan {
  int64_t layers = 1;
  std::vector<int64_t> dims, size, count, pad;  // per dim: merged size, block size, blocks along it, padded size
  std::vector<bool> flag;
  int64_t blocks = 1, block_elems = 1, layer_elems = 1;
  std::vector<int64_t> dest;  // per element of a layer: its offset in the layer's blocks

  int rank() const { return static_cast<int>(dims.size()); }
  int64_t blocked_elems() const { return layers * blocks * block_elems; }
};

leaf_plan make_plan(const leaf_desc& d, std::vector<bool> flag, bool merge, double target, bool partition,
                    int64_t block_size) {
  leaf_plan p;
  const auto sd = static_cast<std::size_t>(std::min<int>(d.stacked_depth, static_cast<int>(d.sizes.size())));
  for (std::size_t i = 0; i < sd; ++i) p.layers *= d.sizes[i];
  p.dims.assign(d.sizes.begin() + static_cast<std::ptrdiff_t>(sd), d.sizes.end());
  if (p.dims.empty()) p.dims = {1};
  if (flag.size() != p.dims.size()) flag.assign(p.dims.size(), true);
  if (merge) merge_small_dims(p.dims, flag, target);
  p.flag = flag;
  for (std::size_t i = 0; i < p.dims.size(); ++i) {
    const int64_t n = p.dims[i];
    const bool cut = partition && block_size > 0 && n > block_size && !flag[i];
    p.size.push_back(cut ? block_size : n);
    p.count.push_back(cut ? (n + block_size - 1) / block_size : 1);
    p.pad.push_back(partition ? (p.size.back() + block_size - 1) / block_size * block_size : p.size.back());
    p.blocks *= p.count.back();
    p.block_elems *= p.pad.back();
    p.layer_elems *= n;
  }
  // dest: walk the layer's elements in row-major order
  const int r = p.rank();
  std::vector<int64_t> bstride(static_cast<std::size_t>(r), 1), estride(static_cast<std::size_t>(r), 1);
  for (int i = r - 2; i >= 0; --i) {
    bstride[static_cast<std::size_t>(i)] = bstride[static_cast<std::size_t>(i) + 1] * p.count[static_cast<std::size_t>(i) + 1];
    estride[static_cast<std::size_t>(i)] = estride[static_cast<std::size_t>(i) + 1] * p.pad[static_cast<std::size_t>(i) + 1];
  }
  p.dest.resize(static_cast<std::size_t>(p.layer_elems));
  std::vector<int64_t> idx(static_cast<std::size_t>(r), 0);
  for (int64_t e = 0; e < p.layer_elems; ++e) {
    int64_t blk = 0, off = 0;
    for (std::size_t i = 0; i < static_cast<std::size_t>(r); ++i) {
      blk += idx[i] / p.size[i] * bstride[i];
      off += idx[i] % p.size[i] * estride[i];
    }
    p.dest[static_cast<std::size_t>(e)] = blk * p.block_elems + off;
    for (int i = r - 1; i >= 0; --i) {
      if (++idx[static_cast<std::size_t>(i)] < p.dims[static_cast<std::size_t>(i)]) break;
      idx[static_cast<std::size_t>(i)] = 0;
    }
  }
  return p;
}

// The leaf (layers x layer_elems) into its padded blocks (layers x blocks x block_elems), and back.
std::vector<float> to_blocks(const leaf_plan& p, const float* x) {
  std::vector<float> out(static_cast<std::size_t>(p.blocked_elems()), 0.0f);
  for (int64_t l = 0; l < p.layers; ++l) {
    const float* src = x + l * p.layer_elems;
    float* dst = out.data() + l * p.blocks * p.block_elems;
    for (int64_t e = 0; e < p.layer_elems; ++e) dst[p.dest[static_cast<std::size_t>(e)]] = src[e];
  }
  return out;
}
void from_blocks(const leaf_plan& p, const float* b, float* x) {
  for (int64_t l = 0; l < p.layers; ++l) {
    const float* src = b + l * p.blocks * p.block_elems;
    float* dst = x + l * p.layer_elems;
    for (int64_t e = 0; e < p.layer_elems; ++e) dst[e] = src[p.dest[static_cast<std::size_t>(e)]];
  }
}

// ---- Mode products on one block (row-major, dims `pad`) -----------------------------------------------------------

struct mode {
  int64_t pre, d, post;
};
mode mode_of(const std::vector<int64_t>& pad, std::size_t i) {
  mode m{1, pad[i], 1};
  for (std::size_t j = 0; j < i; ++j) m.pre *= pad[j];
  for (std::size_t j = i + 1; j < pad.size(); ++j) m.post *= pad[j];
  return m;
}

void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* c) {
  haliax::detail::gemm_batched<float>(ta, tb, 1, m, n, k, a, b, c);
}

// y[.. a ..] = sum_n M[a, n] x[.. n ..] along mode i (M^T with `trans`); y may not alias x.
void mode_apply(const std::vector<int64_t>& pad, std::size_t i, const float* M, bool trans, const float* x, float* y) {
  const auto m = mode_of(pad, i);
  if (m.post == 1) {
    gemm(false, !trans, m.pre, m.d, m.d, x, M, y);  // y = x M'^T
    return;
  }
  for (int64_t p = 0; p < m.pre; ++p) gemm(trans, false, m.d, m.post, m.d, M, x + p * m.d * m.post, y + p * m.d * m.post);
}

// G = x_(i) x_(i)^T (d x d).
void gram(const std::vector<int64_t>& pad, std::size_t i, const float* x, float* G) {
  const auto m = mode_of(pad, i);
  if (m.post == 1) {
    gemm(true, false, m.d, m.d, m.pre, x, x, G);
    return;
  }
  std::vector<float> t(static_cast<std::size_t>(m.d * m.d));
  for (int64_t p = 0; p < m.pre; ++p) {
    gemm(false, true, m.d, m.d, m.post, x + p * m.d * m.post, x + p * m.d * m.post, p == 0 ? G : t.data());
    if (p > 0)
      for (std::size_t k = 0; k < t.size(); ++k) G[k] += t[k];
  }
}

// x scaled along mode i by q (or divided by it).
void mode_scale(const std::vector<int64_t>& pad, std::size_t i, const float* q, bool divide, float* x) {
  const auto m = mode_of(pad, i);
  for (int64_t p = 0; p < m.pre; ++p)
    for (int64_t a = 0; a < m.d; ++a) {
      float* r = x + (p * m.d + a) * m.post;
      for (int64_t s = 0; s < m.post; ++s) r[s] = divide ? r[s] / q[a] : r[s] * q[a];
    }
}

// The sum over the other modes of x^2: a vector along mode i.
std::vector<float> mode_sumsq(const std::vector<int64_t>& pad, std::size_t i, const float* x) {
  const auto m = mode_of(pad, i);
  std::vector<double> s(static_cast<std::size_t>(m.d), 0.0);
  for (int64_t p = 0; p < m.pre; ++p)
    for (int64_t a = 0; a < m.d; ++a) {
      const float* r = x + (p * m.d + a) * m.post;
      for (int64_t k = 0; k < m.post; ++k) s[static_cast<std::size_t>(a)] += static_cast<double>(r[k]) * r[k];
    }
  return {s.begin(), s.end()};
}

// x := Q^{-T} x along mode i, Q upper triangular (d x d): BLAS's single-threaded strsm (the last mode: x Q^{-1};
// another: Q^T \ x per leading index), else forward substitution with Q^T.
void solve_upper_t(const std::vector<int64_t>& pad, std::size_t i, const float* Q, float* x) {
  const auto m = mode_of(pad, i);
#if defined(HALIAX_HAVE_HOST_BLAS)
  if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
  const auto d = static_cast<blasint>(m.d);
  if (m.post == 1) {
    cblas_strsm(CblasRowMajor, CblasRight, CblasUpper, CblasNoTrans, CblasNonUnit, static_cast<blasint>(m.pre), d,
                1.0f, Q, d, x, d);
  } else {
    for (int64_t p = 0; p < m.pre; ++p)
      cblas_strsm(CblasRowMajor, CblasLeft, CblasUpper, CblasTrans, CblasNonUnit, d, static_cast<blasint>(m.post),
                  1.0f, Q, d, x + p * m.d * m.post, static_cast<blasint>(m.post));
  }
  return;
#endif
  std::vector<double> y(static_cast<std::size_t>(m.d));
  for (int64_t p = 0; p < m.pre; ++p)
    for (int64_t s = 0; s < m.post; ++s) {
      float* base = x + p * m.d * m.post + s;
      for (int64_t a = 0; a < m.d; ++a) {
        double acc = base[a * m.post];
        for (int64_t n = 0; n < a; ++n) acc -= static_cast<double>(Q[n * m.d + a]) * y[static_cast<std::size_t>(n)];
        y[static_cast<std::size_t>(a)] = acc / Q[a * m.d + a];
      }
      for (int64_t a = 0; a < m.d; ++a) base[a * m.post] = static_cast<float>(y[static_cast<std::size_t>(a)]);
    }
}

// upstream's _norm_lower_bound of a symmetric d x d matrix: with Y = A / max|A|, j the column of largest norm and
// x = Y[:, j] Y, max|A| |Y (x / |x|)|.
float norm_lower_bound(const float* A, int64_t d) {
  const auto n = static_cast<std::size_t>(d);
  double mx = 0;
  for (std::size_t k = 0; k < n * n; ++k) mx = std::max(mx, static_cast<double>(std::abs(A[k])));
  if (!(mx > 0)) return static_cast<float>(mx);
  std::vector<double> Y(n * n), col(n, 0.0), x(n, 0.0);
  for (std::size_t k = 0; k < n * n; ++k) Y[k] = A[k] / mx;
  for (std::size_t r = 0; r < n; ++r)
    for (std::size_t c = 0; c < n; ++c) col[c] += Y[r * n + c] * Y[r * n + c];
  const std::size_t j = static_cast<std::size_t>(std::max_element(col.begin(), col.end()) - col.begin());
  for (std::size_t r = 0; r < n; ++r)
    for (std::size_t c = 0; c < n; ++c) x[c] += Y[r * n + j] * Y[r * n + c];
  double nx = 0;
  for (double v : x) nx += v * v;
  nx = std::sqrt(nx);
  double nz = 0;
  for (std::size_t r = 0; r < n; ++r) {
    double z = 0;
    for (std::size_t c = 0; c < n; ++c) z += Y[r * n + c] * (x[c] / nx);
    nz += z * z;
  }
  return static_cast<float>(mx * std::sqrt(nz));
}

float bias(double b, int64_t t) { return 1.0f - std::pow(static_cast<float>(b), static_cast<float>(t)); }

// The factors of one leaf (matrices of pad x pad per block and dimension) must fit: upstream gives every 1-D leaf a
// full matrix, which for a long flat leaf is blocks x block_size^2 floats.
void check_factor_size(std::string_view type, const leaf_plan& p, const leaf_desc& d, bool (*has_matrix)(bool)) {
  double floats = 0;
  for (std::size_t i = 0; i < p.dims.size(); ++i)
    if (has_matrix(p.flag[i]))
      floats += static_cast<double>(p.layers * p.blocks) * static_cast<double>(p.pad[i]) * static_cast<double>(p.pad[i]);
  if (floats > 4e9)
    throw std::invalid_argument(
        "optimizer.type '" + std::string(type) + "': parameter '" + d.path + "' would need " +
        std::to_string(static_cast<int64_t>(floats)) +
        " floats of preconditioner factors (it has " + std::to_string(p.layers * p.layer_elems) +
        " elements); lower block_size, or keep such dimensions without a matrix (SOAP: max_precond_dim; Kron: "
        "max_size_triangular)");
}

// ---- PSGD Kron ----------------------------------------------------------------------------------------------------

struct kron_params {
  double b1;
  bool normalize;
  double min_prob, flat_start;
  int64_t max_tri, min_ndim_tri;
  std::string memory_save_mode;
  double precond_lr, init_scale;
  bool merge;
  double target;
  bool partition;
  int64_t block_size;
};

leaf_plan kron_plan(const kron_params& c, const leaf_desc& d) {
  const auto sd = static_cast<std::size_t>(std::min<int>(d.stacked_depth, static_cast<int>(d.sizes.size())));
  std::vector<int64_t> shape(d.sizes.begin() + static_cast<std::ptrdiff_t>(sd), d.sizes.end());
  if (shape.empty()) shape = {1};
  const std::size_t r = shape.size();
  std::vector<bool> diag(r, false);
  if (c.memory_save_mode == "one_diag") {
    std::size_t big = 0;  // the last of the largest
    for (std::size_t i = 0; i < r; ++i)
      if (shape[i] >= shape[big]) big = i;
    diag[big] = true;
  } else if (c.memory_save_mode == "all_diag") {
    diag.assign(r, true);
  }
  for (std::size_t i = 0; i < r; ++i)
    if (shape[i] == 1 || shape[i] > c.max_tri || static_cast<int64_t>(r) < c.min_ndim_tri) diag[i] = true;
  return make_plan(d, diag, c.merge, c.target, c.partition, c.block_size);
}

leaf_arrays kron_state(const kron_params& c, const leaf_desc& d) {
  const auto p = kron_plan(c, d);
  check_factor_size("kron", p, d, [](bool diag) { return !diag; });
  const int64_t n = p.layers * p.layer_elems;
  leaf_arrays s;
  s.add("mu", std::vector<float>(static_cast<std::size_t>(n), 0.0f));
  const float scale = std::pow(static_cast<float>(c.init_scale), 1.0f / static_cast<float>(p.rank()));
  for (std::size_t i = 0; i < p.dims.size(); ++i) {
    const int64_t dd = p.pad[i];
    std::vector<float> q;
    for (int64_t b = 0; b < p.layers * p.blocks; ++b) {
      if (p.flag[i]) {
        q.insert(q.end(), static_cast<std::size_t>(dd), scale);
      } else {
        for (int64_t r = 0; r < dd; ++r)
          for (int64_t k = 0; k < dd; ++k) q.push_back(r == k ? scale : 0.0f);
      }
    }
    s.add("Qs_preconditioners." + std::to_string(i), std::move(q));
  }
  return s;
}

void kron_leaf(const kron_params& c, const rule_step& st, const leaf_desc& d, std::size_t leaf, float* x,
               leaf_arrays& s) {
  const auto p = kron_plan(c, d);
  const int64_t n = p.layers * p.layer_elems;
  if (c.normalize) {
    double sq = 0;
    for (int64_t k = 0; k < n; ++k) sq += static_cast<double>(x[k]) * x[k];
    const float den = static_cast<float>(std::sqrt(sq)) + 1e-16f;
    for (int64_t k = 0; k < n; ++k) x[k] /= den;
  }
  auto& mu = s.at("mu");
  const float b1 = static_cast<float>(c.b1), ib1 = static_cast<float>(1.0 - c.b1), bc = bias(c.b1, st.t);
  for (int64_t k = 0; k < n; ++k) {
    mu[static_cast<std::size_t>(k)] = ib1 * x[k] + b1 * mu[static_cast<std::size_t>(k)];
    x[k] = mu[static_cast<std::size_t>(k)] / bc;
  }
  auto M = to_blocks(p, x);
  const std::size_t r = p.dims.size();
  std::vector<std::vector<float>*> Q(r);
  for (std::size_t i = 0; i < r; ++i) Q[i] = &s.at("Qs_preconditioners." + std::to_string(i));
  auto q_at = [&](std::size_t i, int64_t lb) {
    const int64_t dd = p.pad[i];
    return Q[i]->data() + lb * (p.flag[i] ? dd : dd * dd);
  };
  const int64_t nb = p.layers * p.blocks, be = p.block_elems;
  const bool do_update = (st.w[0] & 1) != 0, balance = (st.w[0] & 2) != 0;
  std::vector<float> t1, t2, tmp(static_cast<std::size_t>(be));
  if (do_update) {
    if (balance)
      for (int64_t lb = 0; lb < nb; ++lb) {
        std::vector<float> norms(r);
        float logsum = 0;
        for (std::size_t i = 0; i < r; ++i) {
          const int64_t sz = p.flag[i] ? p.pad[i] : p.pad[i] * p.pad[i];
          float mx = 0;
          for (int64_t k = 0; k < sz; ++k) mx = std::max(mx, std::abs(q_at(i, lb)[k]));
          norms[i] = mx;
          logsum += std::log(mx);
        }
        const float gmean = std::exp(logsum / static_cast<float>(r));
        for (std::size_t i = 0; i < r; ++i) {
          const int64_t sz = p.flag[i] ? p.pad[i] : p.pad[i] * p.pad[i];
          const float f = gmean / norms[i];
          for (int64_t k = 0; k < sz; ++k) q_at(i, lb)[k] *= f;
        }
      }
    // the probe: jax.random.normal(split(sub, leaves)[leaf], blocked shape)
    const tf::key_data sub{static_cast<std::uint32_t>(st.w[1] >> 32), static_cast<std::uint32_t>(st.w[1])};
    const auto key = tf::split(sub, st.leaves)[leaf];
    std::vector<float> V(M.size());
    const auto nv = static_cast<int64_t>(V.size());
    constexpr int64_t per = 1 << 14;  // element by element, so the split over threads changes nothing
    haliax::detail::thread_pool::instance().run((nv + per - 1) / per, [&](int64_t b) {
      for (int64_t k = b * per; k < std::min(nv, (b + 1) * per); ++k)
        V[static_cast<std::size_t>(k)] = haliax::detail::random_dists::normal_f32(
            tf::bits32_at(key, static_cast<std::uint64_t>(k), static_cast<std::uint64_t>(nv)));
    });
    double abs_sum = 0;
    for (float v : M) abs_sum += std::abs(v);
    const float damp = std::sqrt(std::numeric_limits<float>::epsilon()) *
                       static_cast<float>(abs_sum / static_cast<double>(M.size()));
    std::vector<float> G(M.size());
    for (std::size_t k = 0; k < G.size(); ++k) G[k] = M[k] + damp * V[k];
    for (int64_t lb = 0; lb < nb; ++lb) {
      std::vector<float> A(G.begin() + lb * be, G.begin() + (lb + 1) * be);
      std::vector<float> B(V.begin() + lb * be, V.begin() + (lb + 1) * be);
      for (std::size_t i = 0; i < r; ++i) {
        if (p.flag[i]) {
          mode_scale(p.pad, i, q_at(i, lb), false, A.data());
          mode_scale(p.pad, i, q_at(i, lb), true, B.data());
        } else {
          mode_apply(p.pad, i, q_at(i, lb), false, A.data(), tmp.data());
          A.swap(tmp);
          solve_upper_t(p.pad, i, q_at(i, lb), B.data());
        }
      }
      for (std::size_t i = 0; i < r; ++i) {
        const int64_t dd = p.pad[i];
        float* q = q_at(i, lb);
        const float lr = static_cast<float>(c.precond_lr), tiny = std::numeric_limits<float>::min();
        if (p.flag[i]) {
          const auto s1 = mode_sumsq(p.pad, i, A.data()), s2 = mode_sumsq(p.pad, i, B.data());
          float mx = 0;
          for (int64_t k = 0; k < dd; ++k) mx = std::max(mx, std::abs(s1[static_cast<std::size_t>(k)] + s2[static_cast<std::size_t>(k)]));
          const float f = lr / (mx + tiny);
          for (int64_t k = 0; k < dd; ++k)
            q[k] = q[k] - f * (s1[static_cast<std::size_t>(k)] - s2[static_cast<std::size_t>(k)]) * q[k];
        } else {
          t1.assign(static_cast<std::size_t>(dd * dd), 0.0f);
          t2.assign(t1.size(), 0.0f);
          gram(p.pad, i, A.data(), t1.data());
          gram(p.pad, i, B.data(), t2.data());
          std::vector<float> sum(t1.size()), step(t1.size());
          for (std::size_t k = 0; k < t1.size(); ++k) sum[k] = t1[k] + t2[k];
          const float f = lr / (norm_lower_bound(sum.data(), dd) + tiny);
          for (int64_t a = 0; a < dd; ++a)
            for (int64_t b = 0; b < dd; ++b) {
              const auto k = static_cast<std::size_t>(a * dd + b);
              sum[k] = b >= a ? f * (t1[k] - t2[k]) : 0.0f;
            }
          gemm(false, false, dd, dd, dd, sum.data(), q, step.data());
          for (std::size_t k = 0; k < step.size(); ++k) q[k] = q[k] - step[k];
        }
      }
    }
  }
  // the preconditioned gradient: M along each mode by Q^T Q (q^2 for a diagonal one)
  std::vector<float> out(M.size()), qq;
  for (int64_t lb = 0; lb < nb; ++lb) {
    std::vector<float> X(M.begin() + lb * be, M.begin() + (lb + 1) * be);
    for (std::size_t i = 0; i < r; ++i) {
      const int64_t dd = p.pad[i];
      const float* q = q_at(i, lb);
      if (p.flag[i]) {
        qq.resize(static_cast<std::size_t>(dd));
        for (int64_t k = 0; k < dd; ++k) qq[static_cast<std::size_t>(k)] = q[k] * q[k];
        mode_scale(p.pad, i, qq.data(), false, X.data());
      } else {
        qq.resize(static_cast<std::size_t>(dd * dd));
        gemm(true, false, dd, dd, dd, q, q, qq.data());
        mode_apply(p.pad, i, qq.data(), false, X.data(), tmp.data());
        X.swap(tmp);
      }
    }
    std::copy(X.begin(), X.end(), out.begin() + lb * be);
  }
  from_blocks(p, out.data(), x);
  // optax.clip_by_block_rms(1.1) over the whole leaf
  double sq = 0;
  for (int64_t k = 0; k < n; ++k) sq += static_cast<double>(x[k]) * x[k];
  const float den = std::max(1.0f, std::sqrt(static_cast<float>(sq / static_cast<double>(n))) / 1.1f);
  for (int64_t k = 0; k < n; ++k) x[k] = x[k] / den;
}

// ---- SOAP ---------------------------------------------------------------------------------------------------------

struct soap_params {
  double b1, b2, shampoo_beta, eps;
  int64_t freq, max_precond_dim;
  bool merge, one_diag;
  double target;
  bool partition;
  int64_t block_size;
};

leaf_plan soap_plan(const soap_params& c, const leaf_desc& d) {
  const auto sd = static_cast<std::size_t>(std::min<int>(d.stacked_depth, static_cast<int>(d.sizes.size())));
  const std::size_t r = std::max<std::size_t>(1, d.sizes.size() - sd);
  std::vector<bool> none(r, false);
  if (r > 1) {
    bool kept = false;
    for (std::size_t i = 0; i < r; ++i) {
      none[i] = d.sizes[sd + i] >= c.max_precond_dim;
      if (c.one_diag && !none[i]) {
        if (kept) none[i] = true;
        kept = true;
      }
    }
  }
  return make_plan(d, none, c.merge, c.target, c.partition, c.block_size);
}

leaf_arrays soap_state(const soap_params& c, const leaf_desc& d) {
  const auto p = soap_plan(c, d);
  check_factor_size("soap", p, d, [](bool none) { return !none; });
  const int64_t n = p.layers * p.layer_elems;
  leaf_arrays s;
  s.add("exp_avg", std::vector<float>(static_cast<std::size_t>(n), 0.0f));
  s.add("exp_avg_sq", std::vector<float>(static_cast<std::size_t>(n), 0.0f));
  for (std::size_t i = 0; i < p.dims.size(); ++i) {
    if (p.flag[i]) continue;
    const auto sz = static_cast<std::size_t>(p.layers * p.blocks * p.pad[i] * p.pad[i]);
    s.add("GG." + std::to_string(i), std::vector<float>(sz, 0.0f));
    s.add("Q." + std::to_string(i), std::vector<float>(sz, 0.0f));
  }
  return s;
}

// The eigenvectors of the symmetric d x d matrix A (row-major), as columns in descending order of eigenvalue.
void eigh_descending(const float* A, int64_t d, float* Q) {
#if defined(HALIAX_HAVE_HOST_BLAS)
  const int n = static_cast<int>(d);
  std::vector<double> a(static_cast<std::size_t>(d * d)), w(static_cast<std::size_t>(d));
  for (int64_t k = 0; k < d * d; ++k) a[static_cast<std::size_t>(k)] = A[k];  // symmetric: row- = column-major
  int info = 0, lwork = -1, liwork = -1, iq = 0;
  double wq = 0;
  dsyevd_("V", "U", &n, a.data(), &n, w.data(), &wq, &lwork, &iq, &liwork, &info);
  lwork = static_cast<int>(wq);
  liwork = iq;
  std::vector<double> work(static_cast<std::size_t>(std::max(1, lwork)));
  std::vector<int> iwork(static_cast<std::size_t>(std::max(1, liwork)));
  dsyevd_("V", "U", &n, a.data(), &n, w.data(), work.data(), &lwork, iwork.data(), &liwork, &info);
  if (info != 0) throw std::runtime_error("optimizer soap: eigh did not converge (LAPACK dsyevd info " +
                                          std::to_string(info) + ")");
  // column j of the result (column-major a: a[j * d + r]) is eigenvector j, ascending; flip the order
  for (int64_t r = 0; r < d; ++r)
    for (int64_t j = 0; j < d; ++j) Q[r * d + j] = static_cast<float>(a[static_cast<std::size_t>((d - 1 - j) * d + r)]);
#else
  (void)A, (void)d, (void)Q;
  throw std::invalid_argument("optimizer.type 'soap' needs LAPACK (a build with the host BLAS)");
#endif
}

// Q := the orthonormal factor of the reduced QR decomposition of the d x d matrix B (row-major).
void qr_q(const float* B, int64_t d, float* Q) {
#if defined(HALIAX_HAVE_HOST_BLAS)
  const int n = static_cast<int>(d);
  std::vector<double> a(static_cast<std::size_t>(d * d)), tau(static_cast<std::size_t>(d));
  for (int64_t r = 0; r < d; ++r)
    for (int64_t c = 0; c < d; ++c) a[static_cast<std::size_t>(c * d + r)] = B[r * d + c];  // column-major
  int info = 0, lwork = -1;
  double wq = 0;
  dgeqrf_(&n, &n, a.data(), &n, tau.data(), &wq, &lwork, &info);
  lwork = std::max(1, static_cast<int>(wq));
  std::vector<double> work(static_cast<std::size_t>(lwork));
  dgeqrf_(&n, &n, a.data(), &n, tau.data(), work.data(), &lwork, &info);
  if (info == 0) {
    lwork = -1;
    dorgqr_(&n, &n, &n, a.data(), &n, tau.data(), &wq, &lwork, &info);
    lwork = std::max(1, static_cast<int>(wq));
    work.resize(static_cast<std::size_t>(lwork));
    dorgqr_(&n, &n, &n, a.data(), &n, tau.data(), work.data(), &lwork, &info);
  }
  if (info != 0) throw std::runtime_error("optimizer soap: QR failed (LAPACK info " + std::to_string(info) + ")");
  for (int64_t r = 0; r < d; ++r)
    for (int64_t c = 0; c < d; ++c) Q[r * d + c] = static_cast<float>(a[static_cast<std::size_t>(c * d + r)]);
#else
  (void)B, (void)d, (void)Q;
  throw std::invalid_argument("optimizer.type 'soap' needs LAPACK (a build with the host BLAS)");
#endif
}

void soap_leaf(const soap_params& c, const rule_step& st, const leaf_desc& d, float* x, leaf_arrays& s) {
  const auto p = soap_plan(c, d);
  const int64_t n = p.layers * p.layer_elems;
  const std::size_t r = p.dims.size();
  const int64_t nb = p.layers * p.blocks, be = p.block_elems;
  const float sb = static_cast<float>(1.0 - c.shampoo_beta);
  std::vector<float*> GG(r, nullptr), Q(r, nullptr);
  for (std::size_t i = 0; i < r; ++i)
    if (!p.flag[i]) {
      GG[i] = s.at("GG." + std::to_string(i)).data();
      Q[i] = s.at("Q." + std::to_string(i)).data();
    }
  auto mat = [&](const std::vector<float*>& v, std::size_t i, int64_t lb) { return v[i] + lb * p.pad[i] * p.pad[i]; };
  const auto Gb = to_blocks(p, x);
  std::vector<float> outer, tmp(static_cast<std::size_t>(be));
  // GG_i := GG_i + (1 - shampoo_beta) (g_(i) g_(i)^T - GG_i), into `dst` (the state, or a copy)
  auto update_gg = [&](std::size_t i, int64_t lb, const float* blk, float* dst) {
    const int64_t dd = p.pad[i];
    outer.assign(static_cast<std::size_t>(dd * dd), 0.0f);
    gram(p.pad, i, blk, outer.data());
    const float* old = mat(GG, i, lb);
    for (int64_t k = 0; k < dd * dd; ++k) dst[k] = old[k] + sb * (outer[static_cast<std::size_t>(k)] - old[k]);
  };
  if (st.t == 1) {  // the first step only fills GG and takes its eigenbasis; the update is zero
    for (int64_t lb = 0; lb < nb; ++lb)
      for (std::size_t i = 0; i < r; ++i) {
        if (p.flag[i]) continue;
        const int64_t dd = p.pad[i];
        float* gg = mat(GG, i, lb);
        update_gg(i, lb, Gb.data() + lb * be, gg);
        std::vector<float> reg(gg, gg + dd * dd);
        for (int64_t k = 0; k < dd; ++k) reg[static_cast<std::size_t>(k * dd + k)] += static_cast<float>(c.eps);
        eigh_descending(reg.data(), dd, mat(Q, i, lb));
      }
    std::fill(x, x + n, 0.0f);
    return;
  }
  auto& ea = s.at("exp_avg");
  auto& ev = s.at("exp_avg_sq");
  const float b1 = static_cast<float>(c.b1), ib1 = static_cast<float>(1.0 - c.b1);
  const float b2 = static_cast<float>(c.b2), ib2 = static_cast<float>(1.0 - c.b2);
  for (int64_t k = 0; k < n; ++k) ea[static_cast<std::size_t>(k)] = b1 * ea[static_cast<std::size_t>(k)] + ib1 * x[k];
  const auto Eb = to_blocks(p, ea.data());
  auto Vb = to_blocks(p, ev.data());
  std::vector<float> U(Gb.size());
  const float corr = std::sqrt(bias(c.b2, st.t)) / bias(c.b1, st.t);
  const bool refresh = st.t % c.freq == 0;
  for (int64_t lb = 0; lb < nb; ++lb) {
    // project: X along each mode with a matrix by Q^T
    auto project = [&](const float* src, bool back) {
      std::vector<float> X(src, src + be);
      for (std::size_t i = 0; i < r; ++i) {
        if (p.flag[i]) continue;
        mode_apply(p.pad, i, mat(Q, i, lb), !back, X.data(), tmp.data());
        X.swap(tmp);
      }
      return X;
    };
    const auto gp = project(Gb.data() + lb * be, false);
    const auto mp = project(Eb.data() + lb * be, false);
    float* v = Vb.data() + lb * be;
    std::vector<float> nrm(static_cast<std::size_t>(be));
    for (int64_t k = 0; k < be; ++k) {
      v[k] = b2 * v[k] + ib2 * (gp[static_cast<std::size_t>(k)] * gp[static_cast<std::size_t>(k)]);
      nrm[static_cast<std::size_t>(k)] = mp[static_cast<std::size_t>(k)] / (std::sqrt(v[k]) + static_cast<float>(c.eps));
    }
    const auto u = project(nrm.data(), true);
    for (int64_t k = 0; k < be; ++k) U[static_cast<std::size_t>(lb * be + k)] = u[static_cast<std::size_t>(k)] * corr;
    // GG with this gradient; every precondition_frequency steps, Q from the old GG: sort by the estimated
    // eigenvalues (exp_avg_sq permuted alike), then one QR step of a power iteration
    for (std::size_t i = 0; i < r; ++i) {
      if (p.flag[i]) continue;
      const int64_t dd = p.pad[i];
      std::vector<float> new_gg(static_cast<std::size_t>(dd * dd));
      update_gg(i, lb, Gb.data() + lb * be, new_gg.data());
      float* gg = mat(GG, i, lb);
      if (refresh) {
        float* q = mat(Q, i, lb);
        std::vector<float> gq(static_cast<std::size_t>(dd * dd)), est(static_cast<std::size_t>(dd));
        gemm(false, false, dd, dd, dd, gg, q, gq.data());
        for (int64_t a = 0; a < dd; ++a) {
          double e = 0;
          for (int64_t k = 0; k < dd; ++k) e += static_cast<double>(q[k * dd + a]) * gq[static_cast<std::size_t>(k * dd + a)];
          est[static_cast<std::size_t>(a)] = static_cast<float>(e);
        }
        std::vector<int64_t> idx(static_cast<std::size_t>(dd));
        std::iota(idx.begin(), idx.end(), 0);
        std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) {
          return est[static_cast<std::size_t>(a)] > est[static_cast<std::size_t>(b)];
        });
        // exp_avg_sq taken along mode i; Q's columns likewise
        const auto m = mode_of(p.pad, i);
        std::vector<float> vv(v, v + be);
        for (int64_t pr = 0; pr < m.pre; ++pr)
          for (int64_t a = 0; a < m.d; ++a)
            std::copy_n(vv.data() + (pr * m.d + idx[static_cast<std::size_t>(a)]) * m.post, m.post,
                        v + (pr * m.d + a) * m.post);
        std::vector<float> qs(static_cast<std::size_t>(dd * dd)), gqs(qs.size());
        for (int64_t rr = 0; rr < dd; ++rr)
          for (int64_t a = 0; a < dd; ++a)
            qs[static_cast<std::size_t>(rr * dd + a)] = q[rr * dd + idx[static_cast<std::size_t>(a)]];
        gemm(false, false, dd, dd, dd, gg, qs.data(), gqs.data());
        qr_q(gqs.data(), dd, q);
      }
      std::copy(new_gg.begin(), new_gg.end(), gg);
    }
  }
  from_blocks(p, Vb.data(), ev.data());
  from_blocks(p, U.data(), x);
}

// The clipped gradient into the scratch (the whole-leaf work reads it there).
template <bool Clip>
double clipped_prep_v(const rule_step& st, const rule_chunk& c) {
  const float num = st.clip_num, den = st.clip_den;
  for (int64_t k = 0; k < c.n; ++k) c.x[k] = Clip ? c.g[k] / den * num : c.g[k];
  return 0;
}
double clipped_prep(const rule_step& st, const rule_chunk& c) {
  return st.clip ? clipped_prep_v<true>(st, c) : clipped_prep_v<false>(st, c);
}

// p + (x + wd p) * -lr
template <bool Decay>
double apply_scratch_v(const rule_step& st, const rule_chunk& c) {
  double sq = 0;
  for (int64_t k = 0; k < c.n; ++k) {
    float u = c.x[k];
    if constexpr (Decay) u = u + st.wd * c.p[k];
    const float step = u * st.neg_lr;
    c.p[k] = c.p[k] + step;
    sq += static_cast<double>(step) * step;
  }
  return sq;
}
double apply_scratch(const rule_step& st, const rule_chunk& c) {
  return c.decay ? apply_scratch_v<true>(st, c) : apply_scratch_v<false>(st, c);
}

}  // namespace

rule_def kron_rule(const KronConfig& c) {
  const kron_params k{c.beta1,
                      c.normalize_grads,
                      c.preconditioner_update_probability,
                      static_cast<double>(c.update_prob_flat_start),
                      c.max_size_triangular,
                      c.min_ndim_triangular,
                      c.memory_save_mode.value_or(""),
                      c.preconditioner_lr,
                      c.preconditioner_init_scale,
                      c.merge_small_dims,
                      static_cast<double>(c.target_merged_dim_size),
                      c.partition_grads_into_blocks,
                      c.block_size};
  rule_def r;
  r.type = KronConfig::type_name;
  rule_group g;
  g.name = "kron";
  g.prep = clipped_prep;
  g.loop = apply_scratch;
  if (!c.normalize_grads) g.max_grad_norm = c.max_grad_norm;
  g.leaf_state = [k](const leaf_desc& d) { return kron_state(k, d); };
  g.leaf_with_state = [k](const rule_step& st, const leaf_desc& d, std::size_t leaf, float* x, leaf_arrays& s) {
    kron_leaf(k, st, d, leaf, x, s);
  };
  r.groups.push_back(std::move(g));
  const auto key0 = tf::prng_key(0);
  r.words = {{"key.0", key0.k0}, {"key.1", key0.k1}, {"update_counter", 0}, {"balance_counter", 0}};
  r.begin = [k](std::int64_t t, std::vector<std::pair<std::string, std::int64_t>>& w, std::uint64_t* out) {
    const tf::key_data key{static_cast<std::uint32_t>(w[0].second), static_cast<std::uint32_t>(w[1].second)};
    const auto ks = tf::split(key, 2);
    w[0].second = ks[0].k0;
    w[1].second = ks[0].k1;
    // upstream's precond_update_prob_schedule at t, in float32; the update when the counter reaches 1 / p
    const float prob = std::clamp(std::exp(-0.001f * static_cast<float>(t - static_cast<std::int64_t>(k.flat_start))),
                                  static_cast<float>(k.min_prob), 1.0f);
    const std::int64_t uc = w[2].second + 1;
    const bool update = static_cast<float>(uc) >= 1.0f / prob;
    w[2].second = update ? 0 : uc;
    bool balance = false;
    if (update) {
      const std::int64_t bc = w[3].second + 1;
      balance = bc >= 100;
      w[3].second = balance ? 0 : bc;
    }
    out[0] = (update ? 1u : 0u) | (balance ? 2u : 0u);
    out[1] = (static_cast<std::uint64_t>(ks[1].k0) << 32) | ks[1].k1;
  };
  return r;
}

rule_def soap_rule(const SoapConfig& c) {
  const soap_params s{c.beta1,
                      c.beta2,
                      c.shampoo_beta >= 0 ? c.shampoo_beta : c.beta2,
                      c.epsilon,
                      c.precondition_frequency,
                      c.max_precond_dim,
                      c.merge_small_dims,
                      c.one_diag,
                      static_cast<double>(c.target_merged_dim_size),
                      c.partition_grads_into_blocks,
                      c.block_size};
  rule_def r;
  r.type = SoapConfig::type_name;
  rule_group g;
  g.name = "soap";
  g.prep = clipped_prep;
  g.loop = apply_scratch;
  g.max_grad_norm = c.max_grad_norm;
  g.leaf_state = [s](const leaf_desc& d) { return soap_state(s, d); };
  g.leaf_with_state = [s](const rule_step& st, const leaf_desc& d, std::size_t, float* x, leaf_arrays& a) {
    soap_leaf(s, st, d, x, a);
  };
  r.groups.push_back(std::move(g));
  return r;
}

}  // namespace levanter::optim
