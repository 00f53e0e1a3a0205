// Lowering families run on the real CPU PJRT plugin, their results against values worked
// out by hand from ATen's definitions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "ir/builder.h"
#include "lowering/ops.h"
#include "runtime/pjrt_runtime.h"

using namespace torch_pjrt;
using ir::DType;

namespace {
std::shared_ptr<runtime::Client> client() {
  static std::shared_ptr<runtime::Client> shared = [] {
    const char* path = std::getenv("TORCH_PJRT_TEST_PLUGIN");
    return std::make_shared<runtime::Client>(runtime::Api::load(path ? path : ""), std::vector<runtime::ClientOption>{});
  }();
  return shared;
}

// Runs a one-output graph on two float32 inputs; returns the output's raw bytes.
template <typename Out>
std::vector<Out> run_f32(const ir::Graph& g, const std::vector<float>& a, std::vector<int64_t> a_dims,
                         const std::vector<float>& b, std::vector<int64_t> b_dims, size_t n_out) {
  auto c = client();
  auto exe = c->compile(g.to_mlir());
  auto& dev = c->devices()[0];
  auto ba = c->buffer_from_host(a.data(), PJRT_Buffer_Type_F32, a_dims, dev);
  auto bb = c->buffer_from_host(b.data(), PJRT_Buffer_Type_F32, b_dims, dev);
  auto outs = exe->execute(dev, {ba->raw(), bb->raw()});
  std::vector<Out> r(n_out);
  outs[0]->to_host(r.data(), n_out * sizeof(Out));
  return r;
}
}  // namespace

TEST(Lowering, SearchsortedStopsWhereATensBinarySearchStops) {
  // torch.searchsorted's answers, worked by ATen's loop (start, end; mid; go right unless
  // sorted[mid] >= v): a NaN value lands past every boundary, an unsorted row answers
  // wherever the search stops.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  ir::Graph g;
  ir::Builder b(g);
  auto sorted = g.param({DType::F32, {2, 4}});
  auto values = g.param({DType::F32, {2, 3}});
  g.set_outputs({lowering::searchsorted(b, sorted, values, /*right=*/false)});
  auto r = run_f32<int64_t>(g, {0, 1, 2, 3, /*unsorted:*/ 5, 1, 4, 2}, {2, 4}, {1, nan, 2.5, 3, 4, 0}, {2, 3}, 6);
  EXPECT_EQ(r, (std::vector<int64_t>{1, 4, 3, 2, 2, 0}));

  ir::Graph right;
  ir::Builder rb(right);
  auto row = right.param({DType::F32, {5}});
  auto v = right.param({DType::F32, {4}});
  right.set_outputs({lowering::searchsorted(rb, row, v, /*right=*/true)});
  EXPECT_EQ(run_f32<int64_t>(right, {1, 2, 2, 2, 3}, {5}, {2, 0, 3, nan}, {4}, 4), (std::vector<int64_t>{4, 0, 5, 5}));
}

TEST(Lowering, CopysignTakesTheSignBit) {
  // NaNs give and take signs by their sign bit, -0.0 included, as std::copysign.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  ir::Graph g;
  ir::Builder b(g);
  auto x = g.param({DType::F32, {1}});
  auto y = g.param({DType::F32, {4}});
  auto broadcast_x = b.broadcast_to(x, {4});
  g.set_outputs({lowering::binary(b, "copysign", broadcast_x, y, DType::F32, DType::F32)});
  auto r = run_f32<float>(g, {nan}, {1}, {-1.0f, 2.0f, -0.0f, -nan}, {4}, 4);
  for (size_t i = 0; i < r.size(); ++i) {
    EXPECT_TRUE(std::isnan(r[i]));
    EXPECT_EQ(std::signbit(r[i]), i != 1) << i;
  }
}
