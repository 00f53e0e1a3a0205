// Device activity for profilers: programs run, compiles, transfers, syncs.
// Off unless a sink is set (torch.profiler's session sets one); then every
// event is timed on the wall clock (nanoseconds since the epoch, the clock
// Kineto's traces use). No torch headers.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

namespace torch_pjrt::executor {

enum class TraceKind { Program, Compile, HostToDevice, DeviceToHost, DeviceToDevice, Sync };

struct TraceEvent {
  TraceKind kind;
  std::string name;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  int device = 0;
  int64_t bytes = 0;
  uint64_t correlation = 0;  // the host op that caused it (0: none)
  int64_t thread = 0;        // the host thread it ran on or was launched from
};

using TraceSink = std::function<void(TraceEvent)>;
// The correlation id of the host op running on this thread (the profiler's).
using CorrelationSource = uint64_t (*)();

void set_trace_sink(TraceSink sink, CorrelationSource correlation);  // empty sink: tracing off
bool tracing() noexcept;
int64_t trace_clock_ns() noexcept;
// Fills correlation and thread, and hands the event to the sink (if tracing).
void trace(TraceEvent event);
TraceEvent trace_begin(TraceKind kind, std::string name, int device, int64_t bytes = 0);

// Program launches whose completion event is still to come (each one's
// callback emits its event): a session waits for them before it stops.
void trace_pending(int delta) noexcept;
void wait_for_pending_traces(int timeout_ms);

// Times a scope: the event is emitted at the end (if tracing at the start).
class TraceScope {
 public:
  TraceScope(TraceKind kind, const char* name, int device, int64_t bytes = 0);
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;
  ~TraceScope();

 private:
  bool on_;
  TraceEvent event_;
};

}  // namespace torch_pjrt::executor
