#include "fp8lab/core/stop.hpp"

#include <atomic>

namespace fp8lab {

namespace {
std::atomic<bool> g_stop{false};
static_assert(std::atomic<bool>::is_always_lock_free, "request_stop must be async-signal-safe");
}  // namespace

void request_stop() { g_stop.store(true); }
bool stop_requested() { return g_stop.load(); }
void clear_stop_request() { g_stop.store(false); }

}  // namespace fp8lab
