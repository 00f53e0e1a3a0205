// Collective programs (lowering/collectives.h) over 2, 4 and 8 CPU devices, each
// member launched from its own thread as a process group's ranks launch them; the
// results against the collective's definition worked out on the host.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "executor/launch_barrier.h"
#include "ir/builder.h"
#include "lowering/collectives.h"
#include "runtime/pjrt_runtime.h"

using namespace torch_pjrt;
using lowering::CollectiveKind;
using lowering::CollectiveSpec;
using lowering::Reduction;

namespace {
constexpr int kDevices = 8;

runtime::Client& client() {
  static runtime::Client shared(runtime::Api::load(std::getenv("TORCH_PJRT_TEST_PLUGIN") ? std::getenv("TORCH_PJRT_TEST_PLUGIN") : ""),
                                {{"cpu_device_count", kDevices}});
  return shared;
}

// Member r's input: `n` values from r (small integers: exact in every type and order).
template <typename T>
std::vector<T> input_of(int r, int64_t n) {
  std::vector<T> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<T>(1 + (r * 7 + i * 3) % 5);
  return v;
}

// Runs `spec` on the first spec.replicas devices (member r on device replicas-1-r, so
// that the assignment's order, not the ids', is what counts); every member's output.
// Member r's booleans (as PRED bytes): a mix of true and false across members.
std::vector<uint8_t> booleans_of(int r, int64_t n) {
  std::vector<uint8_t> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(((r + 1) * (i + 1)) % 3 != 0);
  return v;
}

template <typename T>
std::vector<std::vector<T>> run(const CollectiveSpec& spec, PJRT_Buffer_Type type,
                                std::function<std::vector<T>(int, int64_t)> input = input_of<T>) {
  const int launch_id = 1;
  runtime::Client& c = client();
  std::vector<int64_t> assignment;
  for (int r = 0; r < spec.replicas; ++r) assignment.push_back(c.devices()[spec.replicas - 1 - r].id());
  auto exe = c.compile(lowering::collective_module(spec), assignment);
  int64_t n = 1;
  for (int64_t d : spec.input_dims) n *= d;
  const int64_t out_n = lowering::collective_output_elements(spec);
  std::vector<std::vector<T>> outputs(spec.replicas, std::vector<T>(out_n));
  std::vector<std::thread> members;
  for (int r = 0; r < spec.replicas; ++r) {
    members.emplace_back([&, r] {
      const runtime::Device& device = c.devices()[spec.replicas - 1 - r];
      std::vector<T> in = input(r, n);
      auto buffer = c.buffer_from_host(in.data(), type, spec.input_dims, device);
      auto out = exe->execute(device, {buffer->raw()}, nullptr, nullptr, launch_id);
      out.at(0)->to_host(outputs[r].data(), out_n * sizeof(T));
    });
  }
  for (auto& m : members) m.join();
  return outputs;
}

template <typename T>
T combine(Reduction red, T a, T b) {
  switch (red) {
    case Reduction::Sum: return a + b;
    case Reduction::Product: return a * b;
    case Reduction::Min: return a < b ? a : b;
    case Reduction::Max: return a < b ? b : a;
    default: return a;
  }
}
}  // namespace

class CollectivesOver : public ::testing::TestWithParam<int> {};

TEST_P(CollectivesOver, AllReduceEveryReductionMatchesItsDefinition) {
  const int members = GetParam();
  for (Reduction red : {Reduction::Sum, Reduction::Product, Reduction::Min, Reduction::Max}) {
    auto got = run<float>({CollectiveKind::AllReduce, ir::DType::F32, {2, 3}, members, red}, PJRT_Buffer_Type_F32);
    for (int64_t i = 0; i < 6; ++i) {
      float want = input_of<float>(0, 6)[i];
      for (int r = 1; r < members; ++r) want = combine(red, want, input_of<float>(r, 6)[i]);
      for (int r = 0; r < members; ++r) ASSERT_EQ(got[r][i], want) << "member " << r << " element " << i;
    }
  }
}

TEST_P(CollectivesOver, BitwiseAndBooleanReductionsMatchTheirDefinitions) {
  const int m = GetParam();
  for (Reduction red : {Reduction::BitAnd, Reduction::BitOr, Reduction::BitXor}) {
    auto bits = run<int32_t>({CollectiveKind::AllReduce, ir::DType::S32, {5}, m, red}, PJRT_Buffer_Type_S32);
    auto bytes = run<uint8_t>({CollectiveKind::ReduceScatter, ir::DType::U8, {m * 2}, m, red}, PJRT_Buffer_Type_U8);
    for (int r = 0; r < m; ++r) {
      for (int64_t i = 0; i < 5; ++i) {
        int32_t want = input_of<int32_t>(0, 5)[i];
        for (int from = 1; from < m; ++from) {
          const int32_t v = input_of<int32_t>(from, 5)[i];
          want = red == Reduction::BitAnd ? (want & v) : red == Reduction::BitOr ? (want | v) : (want ^ v);
        }
        ASSERT_EQ(bits[r][i], want) << "member " << r;
      }
      for (int64_t i = 0; i < 2; ++i) {  // member r's chunk of the reduction
        uint8_t want = input_of<uint8_t>(0, m * 2)[r * 2 + i];
        for (int from = 1; from < m; ++from) {
          const uint8_t v = input_of<uint8_t>(from, m * 2)[r * 2 + i];
          want = red == Reduction::BitAnd ? (want & v) : red == Reduction::BitOr ? (want | v) : (want ^ v);
        }
        ASSERT_EQ(bytes[r][i], want) << "member " << r;
      }
    }
  }
  // Booleans: a sum is "any", a product "all" (as c10d's backends reduce them).
  for (Reduction red : {Reduction::Sum, Reduction::Product, Reduction::Max, Reduction::Min}) {
    auto got = run<uint8_t>({CollectiveKind::AllReduce, ir::DType::Pred, {4}, m, red}, PJRT_Buffer_Type_PRED,
                            booleans_of);
    const bool any_like = red == Reduction::Sum || red == Reduction::Max;
    for (int64_t i = 0; i < 4; ++i) {
      bool want = !any_like;
      for (int from = 0; from < m; ++from) {
        want = any_like ? (want || booleans_of(from, 4)[i]) : (want && booleans_of(from, 4)[i]);
      }
      for (int r = 0; r < m; ++r) ASSERT_EQ(got[r][i], want ? 1 : 0) << "member " << r << " element " << i;
    }
  }
}

TEST_P(CollectivesOver, AllGatherReduceScatterAndAllToAllMoveEveryChunk) {
  const int m = GetParam();
  const int64_t chunk = 3;
  auto gathered = run<int64_t>({CollectiveKind::AllGather, ir::DType::S64, {chunk}, m}, PJRT_Buffer_Type_S64);
  auto scattered = run<int64_t>({CollectiveKind::ReduceScatter, ir::DType::S64, {m * chunk}, m},
                                PJRT_Buffer_Type_S64);
  auto exchanged = run<int64_t>({CollectiveKind::AllToAll, ir::DType::S64, {m, chunk}, m}, PJRT_Buffer_Type_S64);
  for (int r = 0; r < m; ++r) {
    for (int from = 0; from < m; ++from) {
      for (int64_t i = 0; i < chunk; ++i) {
        ASSERT_EQ(gathered[r][from * chunk + i], input_of<int64_t>(from, chunk)[i]);
        // all-to-all: member r's chunk `from` is member from's chunk r
        ASSERT_EQ(exchanged[r][from * chunk + i], input_of<int64_t>(from, m * chunk)[r * chunk + i]);
      }
    }
    for (int64_t i = 0; i < chunk; ++i) {
      int64_t want = 0;
      for (int from = 0; from < m; ++from) want += input_of<int64_t>(from, m * chunk)[r * chunk + i];
      ASSERT_EQ(scattered[r][i], want) << "member " << r;
    }
  }
}

TEST_P(CollectivesOver, KeepingOneChunkBroadcastsAndScattersFromARoot) {
  const int m = GetParam();
  const int root = m - 1;
  CollectiveSpec broadcast{CollectiveKind::AllGather, ir::DType::F64, {4}, m};
  broadcast.keep_chunk = root;
  CollectiveSpec scatter{CollectiveKind::AllToAll, ir::DType::F64, {m * 2}, m};
  scatter.keep_chunk = root;
  auto b = run<double>(broadcast, PJRT_Buffer_Type_F64);
  auto s = run<double>(scatter, PJRT_Buffer_Type_F64);
  for (int r = 0; r < m; ++r) {
    EXPECT_EQ(b[r], input_of<double>(root, 4)) << "member " << r;
    const auto full = input_of<double>(root, m * 2);
    EXPECT_EQ(s[r], std::vector<double>(full.begin() + 2 * r, full.begin() + 2 * r + 2)) << "member " << r;
  }
}

// Collectives as ops of a larger program (what a captured torch.compile step holds): member
// r computes x*2, all-reduces it, adds 1, all-gathers that and reduce-scatters the gather.
TEST_P(CollectivesOver, CollectivesInsideALargerProgramComposeWithItsOtherOps) {
  const int m = GetParam();
  const int64_t n = 2 * m;
  ir::Graph g;
  ir::Builder b(g);
  ir::Value x = g.param(ir::Type{ir::DType::F32, {2, m}});
  ir::Value doubled = b.binary("multiply", x, b.scalar_like(x, 2));
  CollectiveSpec reduce{CollectiveKind::AllReduce, ir::DType::F32, {2, m}, m};
  ir::Value plus_one = b.binary("add", lowering::collective(b, doubled, reduce), b.constant(ir::DType::F32, 1, {n}));
  CollectiveSpec gather{CollectiveKind::AllGather, ir::DType::F32, {n}, m};
  ir::Value gathered = lowering::collective(b, plus_one, gather);
  CollectiveSpec scatter{CollectiveKind::ReduceScatter, ir::DType::F32, {n * m}, m};
  g.set_outputs({plus_one, lowering::collective(b, gathered, scatter)});
  g.set_replicas(m);
  runtime::Client& c = client();
  std::vector<int64_t> assignment;
  for (int r = 0; r < m; ++r) assignment.push_back(c.devices()[r].id());
  auto exe = c.compile(g.to_mlir(), assignment);
  std::vector<std::vector<float>> sums(m, std::vector<float>(n)), chunks(m, std::vector<float>(n));
  std::vector<std::thread> members;
  for (int r = 0; r < m; ++r) {
    members.emplace_back([&, r] {
      std::vector<float> in = input_of<float>(r, n);
      auto buffer = c.buffer_from_host(in.data(), PJRT_Buffer_Type_F32, {2, m}, c.devices()[r]);
      auto out = exe->execute(c.devices()[r], {buffer->raw()}, nullptr, nullptr, 7);
      out.at(0)->to_host(sums[r].data(), n * sizeof(float));
      out.at(1)->to_host(chunks[r].data(), n * sizeof(float));
    });
  }
  for (auto& t : members) t.join();
  std::vector<float> want(n, 1);
  for (int r = 0; r < m; ++r) {
    for (int64_t i = 0; i < n; ++i) want[i] += 2 * input_of<float>(r, n)[i];
  }
  for (int r = 0; r < m; ++r) {
    EXPECT_EQ(sums[r], want) << "member " << r;
    // Every member gathered the same `want`, so the sum of chunk r is m times it.
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(chunks[r][i], m * want[i]) << "member " << r << " element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Members, CollectivesOver, ::testing::Values(2, 4, 8));

TEST(Collectives, MeaninglessRequestsAreRefused) {
  EXPECT_THROW(lowering::collective_module({CollectiveKind::AllReduce, ir::DType::F32, {4}, 2, Reduction::BitAnd}),
               std::invalid_argument);
  EXPECT_THROW(lowering::collective_module({CollectiveKind::AllReduce, ir::DType::C64, {4}, 2, Reduction::Max}),
               std::invalid_argument);
  EXPECT_THROW(lowering::collective_module({CollectiveKind::ReduceScatter, ir::DType::F32, {5}, 2}),
               std::invalid_argument);
}

// `run` throws std::runtime_error whose message contains `needle`; `otherwise` says what
// it means when it returns.
void expect_error(const std::function<void()>& run, const std::string& needle, const std::string& otherwise) {
  try {
    run();
    ADD_FAILURE() << otherwise;
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// The launch barrier: members pass together; one whose group is gone fails the waiting
// ones at once; a late member is waited for up to the timeout, then named.
TEST(LaunchBarrier, MembersPassTogetherAndALeftOrLateMemberFailsTheOthers) {
  auto& barrier = executor::LaunchBarrier::get();
  const std::vector<int64_t> devices{101, 102, 103};
  for (int64_t d : devices) barrier.join(d);
  std::vector<std::thread> members;
  std::atomic<int> passed{0};
  for (int64_t d : devices) members.emplace_back([&, d] {
    barrier.arrive(7, devices, d);
    ++passed;
  });
  for (auto& t : members) t.join();
  EXPECT_EQ(passed.load(), 3);

  std::thread leaving([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    barrier.leave(103);
  });
  expect_error([&] { barrier.arrive(8, devices, 101, std::chrono::seconds(20)); }, "device 103",
               "a member whose group is gone did not fail the barrier");
  leaving.join();

  barrier.join(103);
  expect_error([&] { barrier.arrive(9, devices, 101, std::chrono::milliseconds(100)); }, "devices 102, 103",
               "a late member was not reported");
  for (int64_t d : devices) barrier.leave(d);
}
