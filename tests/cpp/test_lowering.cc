// Lowering families run on the real CPU PJRT plugin, their results against values worked
// out by hand from ATen's definitions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <algorithm>
#include <string>
#include <vector>

#include "ir/builder.h"
#include "lowering/linalg.h"
#include "lowering/nn.h"
#include "lowering/ops.h"
#include "lowering/views.h"
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
  g.set_outputs({lowering::binary(b, lowering::binary_op("copysign"), broadcast_x, y, DType::F32, DType::F32)});
  auto r = run_f32<float>(g, {nan}, {1}, {-1.0f, 2.0f, -0.0f, -nan}, {4}, 4);
  for (size_t i = 0; i < r.size(); ++i) {
    EXPECT_TRUE(std::isnan(r[i]));
    EXPECT_EQ(std::signbit(r[i]), i != 1) << i;
  }
}

// ---------------------------------------------------------------- one test (at least) per family

namespace {
struct HostArray {
  const void* data;
  PJRT_Buffer_Type type;
  std::vector<int64_t> dims;
};

// Runs a graph on host arrays; returns each output's bytes, read as Out.
template <typename Out>
std::vector<std::vector<Out>> run_graph(const ir::Graph& g, const std::vector<HostArray>& inputs,
                                        const std::vector<size_t>& output_sizes) {
  auto c = client();
  auto exe = c->compile(g.to_mlir());
  auto& dev = c->devices()[0];
  std::vector<std::unique_ptr<runtime::Buffer>> buffers;
  std::vector<PJRT_Buffer*> raw;
  for (const auto& in : inputs) {
    buffers.push_back(c->buffer_from_host(in.data, in.type, in.dims, dev));
    raw.push_back(buffers.back()->raw());
  }
  auto outs = exe->execute(dev, raw);
  std::vector<std::vector<Out>> r;
  for (size_t i = 0; i < output_sizes.size(); ++i) {
    r.emplace_back(output_sizes[i]);
    outs[i]->to_host(r.back().data(), output_sizes[i] * sizeof(Out));
  }
  return r;
}
}  // namespace

TEST(LoweringPointwise, EveryUnaryRowIsComplete) {
  // The ATen layer registers whatever the table holds: a row without a rule, a repeated
  // name or a row with no overload would register a broken or shadowed kernel.
  std::vector<std::string> names;
  for (const auto& op : lowering::unary_ops()) {
    ASSERT_NE(op.name, nullptr);
    EXPECT_NE(op.real, nullptr) << op.name;
    EXPECT_NE(op.variants, 0) << op.name;
    EXPECT_FALSE(op.refuses_complex && op.complex != nullptr) << op.name << ": a complex rule it never uses";
    EXPECT_TRUE(std::find(names.begin(), names.end(), op.name) == names.end()) << op.name << " twice";
    names.push_back(op.name);
    EXPECT_EQ(&lowering::unary_op(op.name), &op);
  }
  EXPECT_GE(names.size(), 60u);
  EXPECT_THROW(lowering::unary_op("no_such_op"), std::invalid_argument);
}

TEST(LoweringPointwise, IntegerRulesFollowTorch) {
  // sgn of unsigned values is "non-zero"; floor is the identity; nothing integral is
  // infinite; frac of an integer is 0.
  ir::Graph g;
  ir::Builder b(g);
  auto u = g.param({DType::U8, {3}});
  auto s = g.param({DType::S32, {3}});
  g.set_outputs({lowering::unary(b, lowering::unary_op("sgn"), u, DType::U8, DType::S32),
                 lowering::unary(b, lowering::unary_op("floor"), s, DType::S32, DType::S32),
                 lowering::unary(b, lowering::unary_op("isinf"), s, DType::S32, DType::S32),
                 lowering::unary(b, lowering::unary_op("frac"), s, DType::S32, DType::S32),
                 lowering::unary(b, lowering::unary_op("sign"), s, DType::S32, DType::S32)});
  const uint8_t us[] = {0, 3, 255};
  const int32_t ss[] = {-7, 0, 9};
  auto r = run_graph<int32_t>(g, {{us, PJRT_Buffer_Type_U8, {3}}, {ss, PJRT_Buffer_Type_S32, {3}}}, {3, 3, 3, 3, 3});
  EXPECT_EQ(r[0], (std::vector<int32_t>{0, 1, 1}));
  EXPECT_EQ(r[1], (std::vector<int32_t>{-7, 0, 9}));
  EXPECT_EQ(r[2], (std::vector<int32_t>{0, 0, 0}));
  EXPECT_EQ(r[3], (std::vector<int32_t>{0, 0, 0}));
  EXPECT_EQ(r[4], (std::vector<int32_t>{-1, 0, 1}));
}

TEST(LoweringPointwise, RefusedComplexInputsThrow) {
  ir::Graph g;
  ir::Builder b(g);
  auto z = g.param({DType::C64, {2}});
  EXPECT_THROW(lowering::unary(b, lowering::unary_op("floor"), z, DType::C64, DType::C64), std::invalid_argument);
}

TEST(LoweringViews, StridedBoxesOfCommonViews) {
  // A transpose of [3, 4] is a dense block read in another order.
  auto t = lowering::strided_box({4, 3}, {1, 4});
  ASSERT_TRUE(t.ok);
  EXPECT_TRUE(t.dense());
  EXPECT_EQ(t.order, (std::vector<int64_t>{1, 0}));
  // Every other column of [3, 4] (x[:, ::2]): a window of 3 rows of 4, its corner 3 x 2 of 3 x 2 x 2.
  auto every_other = lowering::strided_box({3, 2}, {4, 2});
  ASSERT_TRUE(every_other.ok);
  EXPECT_FALSE(every_other.dense());
  EXPECT_EQ(every_other.window_dims, (std::vector<int64_t>{3, 2, 2}));
  EXPECT_EQ(every_other.corner, (std::vector<int64_t>{3, 2, 1}));
  EXPECT_EQ(every_other.pad, 4);
  // Overlapping windows (unfold / as_strided with stride 1 over rows of 3) are no box: gathered.
  EXPECT_FALSE(lowering::strided_box({3, 3}, {1, 1}).ok);
  // With a known offset the second column block [:, 1:3] of a [2, 4] storage is a static slice.
  auto narrow = lowering::strided_box({2, 2}, {4, 1});
  auto grid = lowering::grid_window(narrow, 8, 1, 4);
  ASSERT_TRUE(grid.has_value());
  EXPECT_EQ(grid->grid, (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(grid->start, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(grid->limit, (std::vector<int64_t>{2, 3}));
}

TEST(LoweringViews, ReadAndWriteThroughStridedViews) {
  // A 12-element storage 0..11 seen as [3, 4]; the view x[:, ::2] at offset 1 (columns 1
  // and 3), read with a runtime offset and with a static one, then written with -1s.
  std::vector<float> storage(12);
  for (int i = 0; i < 12; ++i) storage[i] = static_cast<float>(i);
  const lowering::ViewGeometry view{{3, 2}, {4, 2}, 1};
  for (bool static_offsets : {false, true}) {
    ir::Graph g;
    ir::Builder b(g);
    auto flat = g.param({DType::F32, {12}});
    auto offset = g.param({DType::S64, {}});
    lowering::ViewOffsets offsets{[&] { return offset; }, static_offsets};
    ir::Value read = lowering::read_view(b, flat, view, offsets);
    ir::Value written = lowering::write_view(b, flat, view, b.constant(DType::F32, -1.0, {3, 2}), offsets);
    // Overlapping rows (sizes [3, 3], strides [1, 1]): gathered.
    ir::Value windows = lowering::read_view(b, flat, {{3, 3}, {1, 1}, 2}, offsets);
    g.set_outputs({read, written, windows});
    const int64_t off = 1;
    auto r = run_graph<float>(g, {{storage.data(), PJRT_Buffer_Type_F32, {12}}, {&off, PJRT_Buffer_Type_S64, {}}},
                              {6, 12, 9});
    EXPECT_EQ(r[0], (std::vector<float>{1, 3, 5, 7, 9, 11})) << static_offsets;
    EXPECT_EQ(r[1], (std::vector<float>{0, -1, 2, -1, 4, -1, 6, -1, 8, -1, 10, -1})) << static_offsets;
    // A gathered view always takes its offset from the runtime value (1 here).
    EXPECT_EQ(r[2], (std::vector<float>{1, 2, 3, 2, 3, 4, 3, 4, 5})) << static_offsets;
  }
}

TEST(LoweringSpecial, GcdIsNonNegative) {
  ir::Graph g;
  ir::Builder b(g);
  auto x = g.param({DType::S64, {4}});
  auto y = g.param({DType::S64, {4}});
  g.set_outputs({lowering::gcd(b, x, y)});
  const int64_t xs[] = {12, -4, 0, 7}, ys[] = {18, 6, 5, 0};
  auto r = run_graph<int64_t>(g, {{xs, PJRT_Buffer_Type_S64, {4}}, {ys, PJRT_Buffer_Type_S64, {4}}}, {4});
  EXPECT_EQ(r[0], (std::vector<int64_t>{6, 2, 5, 7}));
}

TEST(LoweringReductions, ArgMaxTakesTheFirstMaximumAndNaNWins) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  ir::Graph g;
  ir::Builder b(g);
  auto x = g.param({DType::F32, {2, 4}});
  auto r = lowering::arg_reduce(b, x, 1, /*keepdim=*/false, /*is_max=*/true);
  g.set_outputs({r[1], lowering::sum(b, x, {0}, false, DType::F32)});
  const float xs[] = {1, 5, 5, 2, 3, nan, 9, nan};
  auto idx = run_graph<int64_t>(g, {{xs, PJRT_Buffer_Type_F32, {2, 4}}}, {2, 4});
  EXPECT_EQ(idx[0], (std::vector<int64_t>{1, 1}));
}

TEST(LoweringNn, StableSortKeepsTiesInOrderAndNaNLast) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  ir::Graph g;
  ir::Builder b(g);
  auto x = g.param({DType::F32, {5}});
  auto r = lowering::sort_with_indices(b, x, 0, /*descending=*/false);
  g.set_outputs({r[1]});
  const float xs[] = {2, nan, 1, 2, 0};
  auto idx = run_graph<int64_t>(g, {{xs, PJRT_Buffer_Type_F32, {5}}}, {5});
  EXPECT_EQ(idx[0], (std::vector<int64_t>{4, 2, 0, 3, 1}));
}

TEST(LoweringLinalg, LuDeterminantWithPivoting) {
  // [[0, 2], [1, 3]] needs a row swap: det = -2.
  ir::Graph g;
  ir::Builder b(g);
  auto a = g.param({DType::F64, {2, 2}});
  auto lu = lowering::lu_factor(b, a);
  g.set_outputs({lowering::lu_det(b, lu[0], lu[1]), lowering::tril(b, a, 0)});
  const double as[] = {0, 2, 1, 3};
  auto r = run_graph<double>(g, {{as, PJRT_Buffer_Type_F64, {2, 2}}}, {1, 4});
  EXPECT_NEAR(r[0][0], -2.0, 1e-12);
  EXPECT_EQ(r[1], (std::vector<double>{0, 0, 1, 3}));
}

TEST(LoweringConvert, Float8FollowsTorchsConversionRules) {
  // torch's float -> float8: one rounding from float32 (to nearest even); e4m3fn saturates
  // to +-448 (infinities included), e5m2 overflows to infinity, the fnuz formats to their
  // single NaN (0x80); NaN keeps its sign where the format has signed NaNs (the bytes: torch's).
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x{1.0f, 500.0f, -1e6f, inf, nan, -nan, 1.0625f, 2.0f * std::pow(2.0f, -10)};
  const std::vector<std::pair<DType, std::vector<uint8_t>>> expected = {
      {DType::F8E4M3FN, {0x38, 0x7E, 0xFE, 0x7E, 0x7F, 0xFF, 0x38, 0x01}},
      {DType::F8E5M2, {0x3C, 0x60, 0xFC, 0x7C, 0x7F, 0xFF, 0x3C, 0x18}},
      {DType::F8E4M3FNUZ, {0x40, 0x80, 0x80, 0x80, 0x80, 0x80, 0x40, 0x02}},
  };
  for (const auto& [dtype, bits] : expected) {
    ir::Graph g;
    ir::Builder b(g);
    auto v = g.param({DType::F32, {8}});
    g.param({DType::F32, {1}});
    g.set_outputs({b.convert(v, dtype)});
    EXPECT_EQ(run_f32<uint8_t>(g, x, {8}, {0}, {1}, 8), bits) << ir::dtype_name(dtype);
  }
}

TEST(LoweringIndexing, GuardedUpdatesLeaveTheirTensorBitForBitOnABadIndex) {
  // x = [[-0, NaN], [1.5, -2]]: rows 0 and 9 (out of range) or 0 and 1 get 7s written or
  // added, and a scatter along dim 0 puts 7s at (rows[j], j). With the bad index every update
  // writes back what is there or adds -0, so x comes back bit for bit and the flag holds.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> x_host{-0.0f, nan, 1.5f, -2.0f};
  auto bits_of = [](const std::vector<float>& v) {
    std::vector<uint32_t> u(v.size());
    std::memcpy(u.data(), v.data(), v.size() * sizeof(float));
    return u;
  };
  auto floats_of = [](const std::vector<uint32_t>& u) {
    std::vector<float> v(u.size());
    std::memcpy(v.data(), u.data(), u.size() * sizeof(float));
    return v;
  };
  for (int64_t second_row : {9, 1}) {
    ir::Graph g;
    ir::Builder b(g);
    auto x = g.param({DType::F32, {2, 2}});
    auto rows = g.param({DType::S64, {2}});
    auto seven = b.constant(DType::F32, 7.0, {2, 2});
    std::vector<ir::Value> bad_put, bad_add;
    ir::Value bad_scatter;
    auto put = lowering::guarded_index_put(b, x, {rows}, seven, /*accumulate=*/false, &bad_put);
    auto add = lowering::guarded_index_put(b, x, {rows}, seven, /*accumulate=*/true, &bad_add);
    auto scattered = lowering::guarded_scatter(b, x, 0, b.reshape(rows, {1, 2}), b.constant(DType::F32, 7.0, {1, 2}), "",
                                               &bad_scatter);
    std::vector<ir::Value> flags;
    for (ir::Value f : {bad_put.at(0), bad_add.at(0), bad_scatter}) flags.push_back(b.reshape(b.convert(f, DType::F32), {1}));
    g.set_outputs({b.reshape(put, {4}), b.reshape(add, {4}), b.reshape(scattered, {4}), b.concatenate(flags, 0)});
    const int64_t row_ids[2] = {0, second_row};
    auto r = run_graph<uint32_t>(g, {{x_host.data(), PJRT_Buffer_Type_F32, {2, 2}}, {row_ids, PJRT_Buffer_Type_S64, {2}}},
                                 {4, 4, 4, 3});
    if (second_row == 9) {
      for (int k = 0; k < 3; ++k) EXPECT_EQ(r[k], bits_of(x_host)) << "update " << k;
      EXPECT_EQ(floats_of(r[3]), (std::vector<float>{1, 1, 1}));
      continue;
    }
    EXPECT_EQ(floats_of(r[0]), (std::vector<float>{7, 7, 7, 7}));
    auto added = floats_of(r[1]);
    EXPECT_EQ(added[0], 7.0f);
    EXPECT_TRUE(std::isnan(added[1]));
    EXPECT_EQ(added[2], 8.5f);
    EXPECT_EQ(added[3], 5.0f);
    auto s = floats_of(r[2]);
    EXPECT_EQ(s[0], 7.0f);
    EXPECT_TRUE(std::isnan(s[1]));
    EXPECT_EQ(s[2], 1.5f);
    EXPECT_EQ(s[3], 7.0f);
    EXPECT_EQ(floats_of(r[3]), (std::vector<float>{0, 0, 0}));
  }
}

TEST(LoweringNn, PagedAttentionReadsEachRowsContextThroughItsBlockTable) {
  // One request at position 2 whose blocks are [2, 0] (block size 2: its positions 0 and 1 sit
  // in block 2, position 2 in block 0's first slot), two query heads sharing one key/value head,
  // and a padding row (position -1, which gives 0). Expected values: the softmax over those
  // three slots, worked out here in double; chunks of 1 block (a loop of two trips) and of 5.
  constexpr int64_t kBlocks = 3, kBlockSize = 2, kHead = 2;
  std::vector<float> cache(2 * kBlocks * kBlockSize * kHead);
  for (size_t i = 0; i < cache.size(); ++i) cache[i] = std::sin(0.7f * static_cast<float>(i) + 0.3f);
  const std::vector<float> query{0.5f, -1.0f, 1.5f, 0.25f, /*padding row:*/ 9.0f, 9.0f, 9.0f, 9.0f};  // [2, 1, 2, 2]
  const int64_t block_rows[4] = {2, 0, 0, 0};
  const int64_t positions[2] = {2, -1};
  const double scale = 0.8;
  auto at = [&](int kv, int64_t block, int64_t slot, int d) {
    return static_cast<double>(cache[((kv * kBlocks + block) * kBlockSize + slot) * kHead + d]);
  };
  const std::pair<int64_t, int64_t> context[3] = {{2, 0}, {2, 1}, {0, 0}};  // (block, slot) of positions 0..2
  std::vector<float> expected(8, 0.0f);
  for (int h = 0; h < 2; ++h) {
    double scores[3], total = 0, top = -1e300;
    for (int j = 0; j < 3; ++j) {
      scores[j] = scale * (query[h * 2] * at(0, context[j].first, context[j].second, 0) +
                           query[h * 2 + 1] * at(0, context[j].first, context[j].second, 1));
      top = std::max(top, scores[j]);
    }
    for (double& s : scores) total += (s = std::exp(s - top));
    for (int d = 0; d < 2; ++d) {
      double v = 0;
      for (int j = 0; j < 3; ++j) v += scores[j] / total * at(1, context[j].first, context[j].second, d);
      expected[h * 2 + d] = static_cast<float>(v);
    }
  }
  for (int64_t chunk_blocks : {1, 5}) {
    ir::Graph g;
    ir::Builder b(g);
    auto q = g.param({DType::F32, {2, 1, 2, kHead}});
    auto kv = g.param({DType::F32, {2, kBlocks, 1, kBlockSize, kHead}});
    auto rows = g.param({DType::S64, {2, 2}});
    auto pos = g.param({DType::S64, {2, 1}});
    lowering::PagedAttentionParams p;
    p.scale = scale;
    p.chunk_blocks = chunk_blocks;
    g.set_outputs({b.reshape(lowering::paged_attention(b, q, kv, rows, pos, p), {8})});
    auto r = run_graph<float>(g, {{query.data(), PJRT_Buffer_Type_F32, {2, 1, 2, kHead}},
                                  {cache.data(), PJRT_Buffer_Type_F32, {2, kBlocks, 1, kBlockSize, kHead}},
                                  {block_rows, PJRT_Buffer_Type_S64, {2, 2}},
                                  {positions, PJRT_Buffer_Type_S64, {2, 1}}},
                              {8});
    for (int i = 0; i < 8; ++i) EXPECT_NEAR(r[0][i], expected[i], 1e-5) << "element " << i << ", chunks of " << chunk_blocks;
  }
}
