// The deferred core against the real CPU plugin: fragments recorded into one
// graph, dead values dropped, donation, cache keys, failures.
#include <gtest/gtest.h>

#include <cstdlib>

#include "executor/deferred.h"
#include "executor/trace.h"

#include <chrono>
#include <mutex>
#include <thread>

using namespace torch_pjrt;
using ir::DType;
using ir::Value;

namespace {
executor::Runtime& runtime_for_tests() {
  static auto* rt = new executor::Runtime(std::getenv("TORCH_PJRT_TEST_PLUGIN"), {{"cpu_device_count", 1}}, "");
  return *rt;
}

std::shared_ptr<runtime::Buffer> upload(const std::vector<float>& v) {
  auto& rt = runtime_for_tests();
  return rt.client().buffer_from_host(v.data(), PJRT_Buffer_Type_F32, {static_cast<int64_t>(v.size())},
                                      rt.device(0));
}

std::vector<float> read(const executor::Storage& s) {
  std::vector<float> out(4);
  s.buffer->to_host(out.data(), out.size() * sizeof(float));
  return out;
}

// A fragment: result = x <op> y, where x and y are storages' contents.
executor::Fragment binary(const char* op, executor::Storage* x, executor::Storage* y, executor::Storage* result) {
  executor::Fragment f;
  ir::Builder b(f.graph);
  Value vx = f.graph.param({DType::F32, {4}});
  f.params.push_back({x, nullptr});
  Value vy = vx;
  if (y != x) {
    vy = f.graph.param({DType::F32, {4}});
    f.params.push_back({y, nullptr});
  }
  f.results.emplace_back(result, b.binary(op, vx, vy));
  f.record.op = std::string("test::") + op;
  return f;
}

executor::Storage with(const std::vector<float>& v) {
  executor::Storage s;
  s.buffer = upload(v);
  s.dims = {4};
  s.dtype = DType::F32;
  return s;
}
}  // namespace

TEST(Deferred, RecordsOneProgramAndDropsDeadValues) {
  auto& g = executor::device_graph(runtime_for_tests(), 0);
  executor::metrics().reset();
  executor::Storage a = with({1, 2, 3, 4});
  executor::Storage b, c;
  g.record(binary("add", &a, &a, &b), executor::RecordMode::Defer);  // b = a + a
  g.record(binary("multiply", &b, &a, &c), executor::RecordMode::Defer);  // c = b * a
  EXPECT_TRUE(b.is_pending() && c.is_pending());
  EXPECT_EQ(executor::metrics().executions, 0);
  g.forget(&b);  // b's storage is freed before the flush: never materialized
  g.materialize(&c);
  EXPECT_EQ(executor::metrics().executions, 1);
  EXPECT_EQ(executor::metrics().graph_outputs, 1);
  EXPECT_EQ(executor::metrics().dropped_values, 1);
  EXPECT_FALSE(b.buffer);
  EXPECT_EQ(read(c), (std::vector<float>{2, 8, 18, 32}));
}

TEST(Deferred, SameOpsHitTheCacheWithoutRecompiling) {
  auto& g = executor::device_graph(runtime_for_tests(), 0);
  executor::Storage a = with({1, 2, 3, 4});
  executor::Storage b;
  g.record(binary("add", &a, &a, &b), executor::RecordMode::Run);
  int64_t compiles = executor::metrics().compiles;
  executor::Storage a2 = with({5, 6, 7, 8});
  executor::Storage b2;
  g.record(binary("add", &a2, &a2, &b2), executor::RecordMode::Run);
  EXPECT_EQ(executor::metrics().compiles, compiles);
  g.await_all();
  EXPECT_EQ(read(b2), (std::vector<float>{10, 12, 14, 16}));
}

TEST(Deferred, DonatesAnOverwrittenBufferOnlyWhenNothingElseHoldsIt) {
  auto& g = executor::device_graph(runtime_for_tests(), 0);
  executor::metrics().reset();
  executor::Storage a = with({1, 2, 3, 4});
  g.record(binary("add", &a, &a, &a), executor::RecordMode::Run);  // a += a: donated
  EXPECT_EQ(executor::metrics().donated_buffers, 1);
  EXPECT_EQ(read(a), (std::vector<float>{2, 4, 6, 8}));
  std::shared_ptr<runtime::Buffer> held = a.buffer;  // someone still reads the old buffer
  g.record(binary("add", &a, &a, &a), executor::RecordMode::Run);
  EXPECT_EQ(executor::metrics().donated_buffers, 1);
  EXPECT_EQ(read(a), (std::vector<float>{4, 8, 12, 16}));
  std::vector<float> old(4);
  held->to_host(old.data(), sizeof(float) * 4);
  EXPECT_EQ(old, (std::vector<float>{2, 4, 6, 8}));
}

TEST(Deferred, AssignDropsWhatWasPending) {
  auto& g = executor::device_graph(runtime_for_tests(), 0);
  executor::Storage a = with({1, 2, 3, 4});
  executor::Storage b;
  g.record(binary("add", &a, &a, &b), executor::RecordMode::Defer);
  g.assign(&b, upload({9, 9, 9, 9}), {4}, DType::F32, nullptr);  // a host copy lands later in program order
  g.flush(executor::FlushReason::Explicit);
  EXPECT_EQ(read(b), (std::vector<float>{9, 9, 9, 9}));
}

TEST(Deferred, StructuralKeysSeparateDifferentGraphs) {
  auto key = [](const char* op, int64_t n) {
    ir::Graph g;
    ir::Builder b(g);
    Value x = g.param({DType::F32, {n}});
    g.set_outputs({b.unary(op, x)});
    return g.key();
  };
  EXPECT_TRUE(key("negate", 4) == key("negate", 4));
  EXPECT_FALSE(key("negate", 4) == key("negate", 5));
  EXPECT_FALSE(key("negate", 4) == key("exponential", 4));
}

TEST(Deferred, CaptureKeepsOneProgramThatReplaysOnOtherBuffers) {
  auto& g = executor::device_graph(runtime_for_tests(), 0);
  executor::Storage a = with({1, 2, 3, 4});
  executor::Storage b = with({10, 20, 30, 40});
  executor::Storage c, d;
  g.begin_capture();
  g.record(binary("add", &a, &b, &c), executor::RecordMode::Run);  // no cuts, no runs while capturing
  g.record(binary("multiply", &c, &a, &d), executor::RecordMode::Run);
  EXPECT_TRUE(c.is_pending() && d.is_pending());
  g.forget(&c);  // an intermediate freed before the end: not an output
  auto cap = g.end_capture();
  ASSERT_TRUE(cap->broken.empty()) << cap->broken;
  ASSERT_TRUE(cap->exe);
  EXPECT_EQ(read(d), (std::vector<float>{11, 44, 99, 176}));  // the capture ran as the first call
  ASSERT_EQ(cap->param_storage.size(), 2u);
  EXPECT_EQ(cap->param_storage[0], &a);
  EXPECT_EQ(cap->param_storage[1], &b);
  ASSERT_EQ(cap->out_storage.size(), 1u);
  EXPECT_EQ(cap->out_storage[0], &d);
  EXPECT_EQ(cap->ops->size(), 2u);

  int64_t compiles = executor::metrics().compiles;
  auto outs = g.replay(*cap, {upload({2, 2, 2, 2}), upload({1, 1, 1, 1})});
  ASSERT_EQ(outs.size(), 1u);
  executor::Storage e;
  e.buffer = outs[0];
  EXPECT_EQ(read(e), (std::vector<float>{6, 6, 6, 6}));  // (2 + 1) * 2
  EXPECT_EQ(executor::metrics().compiles, compiles);
}

TEST(Deferred, AHostReadInsideACaptureBreaksItButStillComputes) {
  auto& g = executor::device_graph(runtime_for_tests(), 0);
  executor::Storage a = with({1, 2, 3, 4});
  executor::Storage b, c;
  g.begin_capture();
  g.record(binary("add", &a, &a, &b), executor::RecordMode::Defer);
  g.materialize(&b);  // a host read: the recording is cut here
  g.record(binary("add", &b, &a, &c), executor::RecordMode::Defer);
  auto cap = g.end_capture();
  EXPECT_NE(cap->broken.find("host"), std::string::npos) << cap->broken;
  EXPECT_EQ(read(c), (std::vector<float>{3, 6, 9, 12}));
}

TEST(Trace, AProgramIsAnEventFromLaunchToCompletionWithItsOpsAndCorrelation) {
  auto& g = executor::device_graph(runtime_for_tests(), 0);
  std::mutex mu;
  std::vector<executor::TraceEvent> events;
  executor::set_trace_sink(
      [&](executor::TraceEvent e) {
        std::lock_guard<std::mutex> lock(mu);
        events.push_back(std::move(e));
      },
      [] { return uint64_t{42}; });
  executor::Storage a = with({1, 2, 3, 4});
  executor::Storage b;
  const int64_t before = executor::trace_clock_ns();
  g.record(binary("subtract", &a, &a, &b), executor::RecordMode::Defer);
  g.materialize(&b);
  b.buffer->await_ready();
  g.await_all();
  // The completion callback runs on the plugin's thread: give it a moment.
  for (int i = 0; i < 200; ++i) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!events.empty()) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  executor::set_trace_sink(nullptr, nullptr);
  std::lock_guard<std::mutex> lock(mu);
  std::vector<executor::TraceEvent> programs;
  for (const auto& e : events) {
    if (e.kind == executor::TraceKind::Program) programs.push_back(e);
  }
  ASSERT_EQ(programs.size(), 1u);
  EXPECT_NE(programs[0].name.find("test::subtract"), std::string::npos) << programs[0].name;
  EXPECT_GE(programs[0].start_ns, before);
  EXPECT_GE(programs[0].end_ns, programs[0].start_ns);
  EXPECT_EQ(programs[0].correlation, 42u);
  EXPECT_GT(programs[0].thread, 0);
  EXPECT_FALSE(executor::tracing());
}
