// torch.profiler on pjrt: a Kineto child profiler (PyTorch's PrivateUse1
// profiler registry). While a session records, the executor's trace events
// (executor/trace.h) are kept and handed to Kineto as activities: programs on
// the device's "programs" track (linked to the ATen op that launched them, so
// key_averages() counts their device time), transfers on its "transfers"
// track, compiles and syncs on the host thread that ran them.
#include <libkineto.h>
#include <output_base.h>
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>

#include <limits>
#include <mutex>
#include <set>
#include <vector>

#include "executor/trace.h"

namespace torch_pjrt::device {
namespace {

using executor::TraceEvent;
using executor::TraceKind;

std::mutex g_mu;
std::vector<TraceEvent> g_events;  // of the recording session
thread_local std::vector<uint64_t> t_correlation;  // the ATen ops running on this thread

uint64_t current_correlation() { return t_correlation.empty() ? 0 : t_correlation.back(); }

constexpr int32_t kProgramsTrack = 0;
constexpr int32_t kTransfersTrack = 1;

libkineto::ActivityType activity_type(TraceKind kind) {
  switch (kind) {
    case TraceKind::Program: return libkineto::ActivityType::CONCURRENT_KERNEL;
    case TraceKind::HostToDevice:
    case TraceKind::DeviceToHost:
    case TraceKind::DeviceToDevice: return libkineto::ActivityType::GPU_MEMCPY;
    case TraceKind::Compile:
    case TraceKind::Sync: break;
  }
  return libkineto::ActivityType::PRIVATEUSE1_RUNTIME;
}

std::string activity_name(const TraceEvent& e) {
  switch (e.kind) {
    case TraceKind::Program: return "pjrt program: " + e.name;
    case TraceKind::Compile: return "pjrt compile";
    case TraceKind::HostToDevice: return "pjrt host->device " + std::to_string(e.bytes) + " B (" + e.name + ")";
    case TraceKind::DeviceToHost: return "pjrt device->host " + std::to_string(e.bytes) + " B";
    case TraceKind::DeviceToDevice: return "pjrt device->device " + std::to_string(e.bytes) + " B (" + e.name + ")";
    case TraceKind::Sync: return "pjrt synchronize";
  }
  return e.name;
}

class Session final : public libkineto::IActivityProfilerSession {
 public:
  void start() override {
    {
      std::lock_guard<std::mutex> lock(g_mu);
      g_events.clear();
    }
    executor::set_trace_sink(
        [](TraceEvent e) {
          std::lock_guard<std::mutex> lock(g_mu);
          g_events.push_back(std::move(e));
        },
        &current_correlation);
    status_ = libkineto::TraceStatus::RECORDING;
  }

  void stop() override {
    executor::wait_for_pending_traces(1000);  // programs that finished just before
    executor::set_trace_sink(nullptr, nullptr);
    status_ = libkineto::TraceStatus::PROCESSING;
  }

  std::vector<std::string> errors() override { return {}; }

  void processTrace(libkineto::ActivityLogger& logger) override {
    processTrace(logger, nullptr, 0, std::numeric_limits<int64_t>::max());
  }

  void processTrace(libkineto::ActivityLogger& logger, libkineto::getLinkedActivityCallback linked_activity,
                    int64_t window_start, int64_t window_end) override {
    static const libkineto::TraceSpan span(0, 0, "pjrt");  // activities point at it after this call
    std::vector<TraceEvent> events;
    {
      std::lock_guard<std::mutex> lock(g_mu);
      events.swap(g_events);
    }
    const int32_t pid = libkineto::processId();
    for (const TraceEvent& e : events) {
      if (e.end_ns < window_start || e.start_ns > window_end) continue;
      libkineto::GenericTraceActivity a(span, activity_type(e.kind), activity_name(e));
      a.startTime = e.start_ns;
      a.endTime = std::max(e.end_ns, e.start_ns);
      if (e.kind == TraceKind::Compile || e.kind == TraceKind::Sync) {
        a.device = pid;  // the host thread's track
        a.resource = static_cast<int32_t>(e.thread);
      } else {
        a.device = e.device;
        a.resource = e.kind == TraceKind::Program ? kProgramsTrack : kTransfersTrack;
      }
      a.threadId = static_cast<int32_t>(e.thread);
      a.id = static_cast<int32_t>(e.correlation);
      if (linked_activity && e.correlation != 0) a.linked = linked_activity(static_cast<int32_t>(e.correlation));
      a.addMetadataQuoted("kind", e.kind == TraceKind::Program ? "program" : e.kind == TraceKind::Compile ? "compile"
                                  : e.kind == TraceKind::Sync ? "sync" : "transfer");
      if (e.bytes) a.addMetadataQuoted("bytes", std::to_string(e.bytes));
      logger.handleGenericActivity(a);
    }
  }

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    return std::make_unique<libkineto::DeviceInfo>(libkineto::DeviceInfo{0, 1000, "pjrt", "pjrt:0"});
  }

  std::vector<libkineto::ResourceInfo> getResourceInfos() override {
    return {libkineto::ResourceInfo{kProgramsTrack, 0, 0, "programs"},
            libkineto::ResourceInfo{kTransfersTrack, 1, 0, "transfers"}};
  }

  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override { return nullptr; }

  void pushCorrelationId(uint64_t id) override { t_correlation.push_back(id); }
  void popCorrelationId() override {
    if (!t_correlation.empty()) t_correlation.pop_back();
  }
};

class PjrtProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }
  const std::set<libkineto::ActivityType>& availableActivities() const override { return activities_; }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(const std::set<libkineto::ActivityType>& types,
                                                                 const libkineto::Config& /*config*/) override {
    // Only when device activity was asked for (ProfilerActivity.PrivateUse1).
    if (!types.count(libkineto::ActivityType::CONCURRENT_KERNEL)) return nullptr;
    return std::make_unique<Session>();
  }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(int64_t /*ts_ms*/, int64_t /*duration_ms*/,
                                                                 const std::set<libkineto::ActivityType>& types,
                                                                 const libkineto::Config& config) override {
    return configure(types, config);
  }

 private:
  std::string name_{"pjrt"};
  std::set<libkineto::ActivityType> activities_{libkineto::ActivityType::CONCURRENT_KERNEL,
                                                libkineto::ActivityType::GPU_MEMCPY,
                                                libkineto::ActivityType::PRIVATEUSE1_RUNTIME};
};

}  // namespace
}  // namespace torch_pjrt::device

using PjrtKinetoProfiler = torch_pjrt::device::PjrtProfiler;
REGISTER_PRIVATEUSE1_PROFILER(PjrtKinetoProfiler);
