#include "executor/trace.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <thread>

namespace torch_pjrt::executor {
namespace {
std::atomic<bool> g_on{false};
std::mutex g_mu;
std::shared_ptr<const TraceSink> g_sink;  // replaced whole: readers keep theirs
std::atomic<CorrelationSource> g_correlation{nullptr};
std::atomic<int> g_pending{0};

int64_t this_thread() {
  static thread_local int64_t tid = static_cast<int64_t>(::syscall(SYS_gettid));
  return tid;
}
}  // namespace

void set_trace_sink(TraceSink sink, CorrelationSource correlation) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_correlation = correlation;
  g_sink = sink ? std::make_shared<const TraceSink>(std::move(sink)) : nullptr;
  g_on = static_cast<bool>(g_sink);
}

bool tracing() noexcept { return g_on.load(std::memory_order_relaxed); }

int64_t trace_clock_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

TraceEvent trace_begin(TraceKind kind, std::string name, int device, int64_t bytes) {
  TraceEvent e{kind, std::move(name), trace_clock_ns(), 0, device, bytes};
  if (CorrelationSource source = g_correlation.load()) e.correlation = source();
  e.thread = this_thread();
  return e;
}

void trace(TraceEvent event) {
  std::shared_ptr<const TraceSink> sink;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    sink = g_sink;
  }
  if (!sink) return;
  if (event.end_ns < event.start_ns) event.end_ns = event.start_ns;
  (*sink)(std::move(event));
}

void trace_pending(int delta) noexcept { g_pending += delta; }

void wait_for_pending_traces(int timeout_ms) {
  for (int waited = 0; g_pending.load() > 0 && waited < timeout_ms; ++waited) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

TraceScope::TraceScope(TraceKind kind, const char* name, int device, int64_t bytes) : on_(tracing()) {
  if (on_) event_ = trace_begin(kind, name, device, bytes);
}

TraceScope::~TraceScope() {
  if (!on_) return;
  event_.end_ns = trace_clock_ns();
  trace(std::move(event_));
}

}  // namespace torch_pjrt::executor
