// haliax/ambient.hpp: a value that code reads from its thread rather than from its arguments, for the span of a
// scope, and that may hold arrays a gradient must reach (LoRA's adapters, which every Linear reads through
// nn::linear_side).
//
//   auto side = std::make_shared<my_side>(...);          // derives from haliax::ambient
//   haliax::ambient_scope scope(side);                    // in force on this thread until the scope ends
//
// Gradient checkpointing (`checkpoint` in autodiff.hpp) recomputes a function in the backward pass, after the
// scope that was in force when it first ran may have ended. So `checkpoint` saves the ambient in force with the
// function's arguments and recomputes under `rebound(...)`'s copy of it: the copy's tracked arrays are leaves of the
// recomputation's tape, and `transfers` hand their gradients to the originals.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace haliax {

/// What an ambient value must do for gradient checkpointing.
struct ambient {
  virtual ~ambient() = default;
  /// A copy whose arrays tracked on the tape `outer` are rebound as leaves of the tape now active
  /// (detail::ad::rebind_leaves), queueing into `transfers` the moves of their gradients to the originals.
  virtual std::shared_ptr<const ambient> rebound(std::uint64_t outer,
                                                 std::vector<std::function<void()>>& transfers) const = 0;
};

namespace detail {
inline std::shared_ptr<const ambient>& ambient_slot() {
  thread_local std::shared_ptr<const ambient> a;
  return a;
}
}  // namespace detail

/// The ambient value in force on this thread (null: none).
inline const std::shared_ptr<const ambient>& current_ambient() { return detail::ambient_slot(); }

/// Puts `a` in force on this thread until the scope ends; the previous one is restored then.
class ambient_scope {
 public:
  explicit ambient_scope(std::shared_ptr<const ambient> a) : prev_(std::move(detail::ambient_slot())) {
    detail::ambient_slot() = std::move(a);
  }
  ~ambient_scope() { detail::ambient_slot() = std::move(prev_); }
  ambient_scope(const ambient_scope&) = delete;
  ambient_scope& operator=(const ambient_scope&) = delete;

 private:
  std::shared_ptr<const ambient> prev_;
};

}  // namespace haliax
