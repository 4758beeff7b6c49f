// Cancellation and progress of a long model run. A command that drives the programs
// (the CLI's sweep) may ask them to stop from a signal handler: an atomic flag, which
// the host backend checks before every op and the programs at every layer, whereupon
// the run throws Cancelled. The programs also tell an observer each layer they start,
// for a progress line. Neither touches a value the programs compute.
#pragma once
#include <atomic>
#include <cstdint>
#include <stdexcept>

namespace bp::program::run_control {

// What a run throws when cancellation was requested.
class Cancelled : public std::runtime_error {
 public:
  Cancelled() : std::runtime_error("cancelled") {}
};

// Set from a signal handler, so lock-free.
inline std::atomic<bool> cancel_requested{false};
static_assert(std::atomic<bool>::is_always_lock_free);

// Told each layer a program starts: pass "forward" or "backward", layer in [0, layers).
// Called from the emulated ranks' threads too, so it must be thread-safe.
using LayerObserver = void (*)(const char* pass, int64_t layer, int64_t layers);
inline std::atomic<LayerObserver> layer_observer{nullptr};

// Between ops: throws Cancelled when cancellation was requested.
inline void check() {
  if (cancel_requested.load(std::memory_order_relaxed)) throw Cancelled();
}

// At the start of a layer: check(), then the observer (if any) is told.
inline void at_layer(const char* pass, int64_t layer, int64_t layers) {
  check();
  if (const LayerObserver observe = layer_observer.load(std::memory_order_relaxed)) observe(pass, layer, layers);
}

}  // namespace bp::program::run_control
