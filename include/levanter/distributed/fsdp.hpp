// levanter/distributed/fsdp.hpp: parameters sharded over the data ranks (upstream's `fsdp_axis`), gathered just in
// time. Each rank keeps one contiguous range of the parameters flattened in tree order (the optimizer's shard
// ranges, on AdamW's chunk boundaries) and nothing else of them between steps.
//
//   distributed::fsdp_params<M> fs(world, *optimizer->shard_bounds(), model);   // model: whole, on every rank
//   M step = fs.step_model();          // collective: the parameters outside Stacked modules gathered whole; every
//                                      // Stacked reads its layers from the ranks one at a time (layer_source)
//   auto [loss, g] = haliax::value_and_grad(loss_fn)(step);   // each layer's gradient is reduce-scattered into
//                                      // fs.grads() when its backward is done; the layer's arrays are freed
//   fs.reduce_rest(g);                 // collective: the gradients of the parameters outside Stacked modules
//   optimizer->update_range(fs.params().data(), fs.grads().data(), loss);   // shards in the arrays' memory space
//   M whole = fs.whole();              // collective: every parameter on every rank (checkpoints, hooks)
//
// Model code never sees any of this: a Stacked whose `source` is set folds over layers that the source gathers
// (haliax/nn/stacked.hpp). With gradient checkpointing (the models' default) a layer is gathered for its forward,
// freed, gathered again for its recomputation in backward and freed once its gradient has left; without it, the
// tape keeps every gathered layer until backward (correct, but the memory saving is then only between steps).
// docs/distributed.md gives the bytes and memory formulas.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <boost/hana/accessors.hpp>
#include <boost/hana/for_each.hpp>
#include <boost/hana/second.hpp>
#include <haliax/autodiff.hpp>
#include <haliax/detail/ad.hpp>
#include <haliax/nn/stacked.hpp>
#include <haliax/tree.hpp>
#include <levanter/distributed/comm.hpp>
#include <levanter/distributed/device_copy.hpp>

namespace levanter::distributed {

namespace detail::fsdp {

template <class T>
inline constexpr bool is_stacked_v = false;
template <auto L, template <class> class B>
inline constexpr bool is_stacked_v<haliax::nn::Stacked<L, B>> = true;

/// Calls `f(stacked)` for every haliax::nn::Stacked module inside `x`, in tree order (not inside a Stacked).
template <class X, class F>
void for_each_stacked(X& x, F& f) {
  using T = std::remove_const_t<X>;
  if constexpr (is_stacked_v<T>) {
    f(x);
  } else if constexpr (haliax::is_named_array_v<T>) {
  } else if constexpr (haliax::tree::detail::is_optional_v<T>) {
    if (x) for_each_stacked(*x, f);
  } else if constexpr (haliax::tree::detail::is_vector_v<T>) {
    for (auto& e : x) for_each_stacked(e, f);
  } else if constexpr (boost::hana::Struct<T>::value) {
    boost::hana::for_each(boost::hana::accessors<T>(),
                          [&](auto pair) { for_each_stacked(boost::hana::second(pair)(x), f); });
  }
}

/// Runs after every use of one gathered layer in backward (it is placed on the tape before them): hands each
/// parameter's gradient to the owner of the shards.
struct layer_grad_node final : haliax::detail::ad::node_base {
  std::vector<std::function<void()>> reduce;
  void run_backward() override {
    for (auto& f : reduce) f();
    reduce.clear();
  }
};

}  // namespace detail::fsdp

/// One rank's share of a model's parameters, and the collectives that move them (see the file comment).
template <class M>
class fsdp_params {
 public:
  struct leaf {
    std::string path;
    std::int64_t offset = 0, count = 0;
    std::vector<std::int64_t> sizes;
    bool stacked = false;  // inside a Stacked module: gathered per layer
  };

  /// `bounds`: rank r keeps [bounds[r], bounds[r+1]) of the flattened parameters; `model` is whole (the same on
  /// every rank); only this rank's range of it is kept.
  fsdp_params(communicator& c, std::vector<std::int64_t> bounds, const M& model)
      : comm_(c), bounds_(std::move(bounds)) {
    std::map<const float*, std::size_t> by_data;
    std::int64_t off = 0;
    haliax::tree::for_each_leaf(model, [&](const std::string& path, const auto& a) {
      static_assert(std::is_same_v<typename std::remove_cvref_t<decltype(a)>::value_type, float>,
                    "levanter::distributed::fsdp_params: every parameter must be float32");
      leaf l{path, off, a.element_count(), {a.sizes().begin(), a.sizes().end()}, false};
      by_data[a.data()] = leaves_.size();
      leaves_.push_back(std::move(l));
      off += a.element_count();
    });
    if (bounds_.size() != static_cast<std::size_t>(comm_.size()) + 1 || bounds_.back() != off)
      throw comm_error("fsdp_params: the shard bounds do not cover the model's " + std::to_string(off) +
                       " parameters");
    // The Stacked modules: their leaves (found by buffer), per-layer sizes, and a skeleton layer.
    auto visit = [&](const auto& s) {
      using S = std::remove_cvref_t<decltype(s)>;
      auto src = std::make_shared<layer_gatherer<S>>(*this);
      src->layers = s.num_layers();
      haliax::tree::for_each_leaf(s.stacked, [&](const std::string& path, const auto& a) {
        const auto it = by_data.find(a.data());
        if (it == by_data.end())
          throw comm_error("fsdp_params: the stacked parameter '" + path + "' is not a leaf of the model");
        auto& l = leaves_[it->second];
        l.stacked = true;
        src->offsets.push_back(l.offset);
        src->per_layer.push_back(l.count / src->layers);
        src->sizes.emplace_back(l.sizes.begin() + 1, l.sizes.end());
      });
      auto layers = s.unstack();  // views of the model's buffers; only the structure is kept
      src->skeleton = layers.front();
      haliax::tree::for_each_leaf(src->skeleton, [](const std::string&, auto& a) { a = {}; });
      sources_.push_back(src);
    };
    detail::fsdp::for_each_stacked(model, visit);
    params_ = device_copy::flat("levanter::fsdp::params", static_cast<std::size_t>(hi() - lo()));  // zeroed
    grads_ = device_copy::flat("levanter::fsdp::grads", params_.extent(0));
    copy_range(model, true);
    skeleton_ = model;
    haliax::tree::for_each_leaf(skeleton_, [](const std::string&, auto& a) { a = {}; });
  }

  fsdp_params(const fsdp_params&) = delete;
  fsdp_params& operator=(const fsdp_params&) = delete;

  std::int64_t lo() const { return bounds_[static_cast<std::size_t>(comm_.rank())]; }
  std::int64_t hi() const { return bounds_[static_cast<std::size_t>(comm_.rank()) + 1]; }
  const std::vector<std::int64_t>& bounds() const { return bounds_; }
  const std::vector<leaf>& leaves() const { return leaves_; }
  /// This rank's range of the parameters and of the gradient being summed, in the arrays' memory space (device
  /// memory in a GPU build, where the optimizer updates them).
  const device_copy::flat& params() const { return params_; }
  const device_copy::flat& grads() const { return grads_; }
  void zero_grads() {
    if (grads_.extent(0) > 0) Kokkos::deep_copy(grads_, 0.0f);
  }
  /// grads() *= s, element by element.
  void scale_grads(float s) { device_copy::scale(grads_.data(), static_cast<std::int64_t>(grads_.extent(0)), s); }
  /// The model's structure with no parameter held (what the train state keeps between steps).
  const M& skeleton() const { return skeleton_; }
  /// Bytes of parameters this rank holds between steps.
  std::int64_t resident_bytes() const { return static_cast<std::int64_t>(params_.extent(0)) * 4; }

  /// The model for one step (collective): parameters outside Stacked modules whole, Stacked modules reading
  /// their layers from the ranks.
  M step_model() {
    M m = skeleton_;
    std::size_t k = 0;
    haliax::tree::for_each_leaf(m, [&](const std::string&, auto& a) {
      const auto& l = leaves_[k++];
      if (l.stacked) return;
      a = allocate_like(a, l.sizes);
      haliax::with_host_elements(a, 0, l.count, haliax::host_access::write,
                                 [&](float* p) { gather(p, l.offset, l.count); });
    });
    std::size_t s = 0;
    auto attach = [&](auto& st) {
      using S = std::remove_cvref_t<decltype(st)>;
      st.source = std::static_pointer_cast<const layer_gatherer<S>>(sources_[s++]);
    };
    detail::fsdp::for_each_stacked(m, attach);
    return m;
  }

  /// Adds the gradients of the parameters outside Stacked modules (`g`: value_and_grad's result on step_model())
  /// to grads(), summed over the ranks (collective; `g`'s buffers are used as scratch).
  void reduce_rest(M& g) {
    std::size_t k = 0;
    haliax::tree::for_each_leaf(g, [&](const std::string&, auto& a) {
      const auto& l = leaves_[k++];
      if (l.stacked) return;
      if (!a.valid() || a.element_count() != l.count)
        throw comm_error("fsdp_params: no gradient for '" + l.path + "'");
      // The collective runs on a host copy where `a` is device memory; `a` is scratch, not written back.
      haliax::with_host_elements(a, 0, l.count, haliax::host_access::read,
                                 [&](float* p) { scatter_add(p, l.offset, l.count); });
    });
  }

  /// Every parameter on every rank (collective), as a model.
  M whole() { return whole_of(params_); }
  /// The gradient summed so far (grads()), whole on every rank (collective; for trainer.watch).
  M whole_grads() { return whole_of(grads_); }

  /// Replaces this rank's range by that of `model` (whole on every rank, e.g. just loaded).
  void assign(const M& model) { copy_range(model, true); }

 private:
  template <class A>
  static A allocate_like(const A&, const std::vector<std::int64_t>& sizes) {
    typename A::shape_type sh{};
    std::copy(sizes.begin(), sizes.end(), sh.begin());
    return A::allocate(sh, "levanter::fsdp::gathered");
  }

  // The bounds of the ranks' ranges inside the region [off, off + n).
  std::vector<std::int64_t> region_bounds(std::int64_t off, std::int64_t n) const {
    std::vector<std::int64_t> b(bounds_.size());
    for (std::size_t q = 0; q < b.size(); ++q) b[q] = std::clamp<std::int64_t>(bounds_[q] - off, 0, n);
    return b;
  }
  M whole_of(const device_copy::flat& mine) {
    M m = skeleton_;
    std::size_t k = 0;
    haliax::tree::for_each_leaf(m, [&](const std::string&, auto& a) {
      const auto& l = leaves_[k++];
      a = allocate_like(a, l.sizes);
      haliax::with_host_elements(a, 0, l.count, haliax::host_access::write,
                                 [&](float* p) { gather(p, l.offset, l.count, mine); });
    });
    return m;
  }
  // dst[0, n) (host memory) = the elements [off, off + n) of the flattened parameters (or of the shard `mine`),
  // from the ranks that hold them.
  void gather(float* dst, std::int64_t off, std::int64_t n) { gather(dst, off, n, params_); }
  void gather(float* dst, std::int64_t off, std::int64_t n, const device_copy::flat& mine) {
    const auto b = region_bounds(off, n);
    const std::int64_t mb = b[static_cast<std::size_t>(comm_.rank())], me = b[static_cast<std::size_t>(comm_.rank()) + 1];
    device_copy::to_host(mine.data() + (off + mb - lo()), dst + mb, me - mb);
    allgather_ranges(comm_, dst, b);
  }
  // grads()[the part of [off, off + n) this rank holds] += the sum over ranks of g[0, n) (host memory) there.
  void scatter_add(float* g, std::int64_t off, std::int64_t n) {
    const auto b = region_bounds(off, n);
    reduce_scatter_sum(comm_, g, b);
    const std::int64_t mb = b[static_cast<std::size_t>(comm_.rank())], me = b[static_cast<std::size_t>(comm_.rank()) + 1];
    device_copy::add_from_host(grads_.data() + (off + mb - lo()), g + mb, me - mb);
  }
  void copy_range(const M& model, bool to_shard) {
    std::size_t k = 0;
    haliax::tree::for_each_leaf(model, [&](const std::string&, const auto& a) {
      const auto& l = leaves_[k++];
      const std::int64_t b = std::max(lo(), l.offset), e = std::min(hi(), l.offset + l.count);
      if (b < e && to_shard) device_copy::copy(a.data() + (b - l.offset), params_.data() + (b - lo()), e - b);
    });
  }

  // A Stacked module's layers, gathered from the ranks when asked for.
  template <class S>
  struct layer_gatherer final : haliax::nn::layer_source<typename S::layer_type> {
    using layer_type = typename S::layer_type;
    explicit layer_gatherer(fsdp_params& o) : owner(&o) {}
    fsdp_params* owner;
    std::int64_t layers = 0;
    std::vector<std::int64_t> offsets, per_layer;  // per leaf of the layer, in tree order
    std::vector<std::vector<std::int64_t>> sizes;
    layer_type skeleton;

    std::int64_t num_layers() const override { return layers; }
    layer_type layer(std::int64_t i) const override {
      namespace ad = haliax::detail::ad;
      layer_type l = skeleton;
      std::shared_ptr<detail::fsdp::layer_grad_node> node;
      if (haliax::is_recording()) {
        node = std::make_shared<detail::fsdp::layer_grad_node>();
        node->tape_id = ad::thread_state().current->id;
        ad::thread_state().current->nodes.push_back(node);
      }
      std::size_t k = 0;
      haliax::tree::for_each_leaf(l, [&](const std::string&, auto& a) {
        const std::int64_t off = offsets[k] + i * per_layer[k], n = per_layer[k];
        a = allocate_like(a, sizes[k]);
        haliax::with_host_elements(a, 0, n, haliax::host_access::write, [&](float* p) { owner->gather(p, off, n); });
        ++k;
        if (!node) return;
        auto leaf_node = ad::make_leaf(a);
        node->reduce.push_back([leaf_node, o = owner, off, n] {
          std::vector<float> g(static_cast<std::size_t>(n), 0.0f);
          if (leaf_node->grad.valid())
            haliax::with_host_elements(leaf_node->grad, 0, n, haliax::host_access::read,
                                       [&](const float* p) { std::copy(p, p + n, g.data()); });
          leaf_node->grad = {};
          o->scatter_add(g.data(), off, n);
        });
      });
      return l;
    }
  };

  communicator& comm_;
  std::vector<std::int64_t> bounds_;
  std::vector<leaf> leaves_;
  device_copy::flat params_, grads_;  // this rank's range, in the arrays' memory space
  std::vector<std::shared_ptr<void>> sources_;  // one layer_gatherer per Stacked module, in tree order
  M skeleton_;
};

}  // namespace levanter::distributed
