#include <gtest/gtest.h>

#include "ir/builder.h"
#include "lowering/ops.h"

using namespace torch_pjrt;

TEST(IR, PrintsGenericStableHLO) {
  ir::Graph g;
  ir::Builder b(g);
  auto x = g.param({ir::DType::F32, {2, 3}});
  auto s = b.reduce_simple(x, b.constant(ir::DType::F32, 0), {1}, "add");
  g.set_outputs({s});
  std::string text = g.to_mlir();
  EXPECT_NE(text.find("func.func public @main(%arg0: tensor<2x3xf32>) -> (tensor<2xf32>)"), std::string::npos);
  EXPECT_NE(text.find("\"stablehlo.reduce\""), std::string::npos);
  EXPECT_NE(text.find("\"stablehlo.return\""), std::string::npos);
  EXPECT_NE(text.find("dimensions = array<i64: 1>"), std::string::npos);
  EXPECT_EQ(text.find("loc("), std::string::npos);
}

TEST(IR, HashIsStructural) {
  auto build = [](ir::DType d, int64_t n) {
    ir::Graph g;
    ir::Builder b(g);
    auto x = g.param({d, {n}});
    g.set_outputs({b.unary("exponential", x)});
    return g.hash();
  };
  EXPECT_EQ(build(ir::DType::F32, 4), build(ir::DType::F32, 4));
  EXPECT_NE(build(ir::DType::F32, 4), build(ir::DType::F32, 5));
  EXPECT_NE(build(ir::DType::F32, 4), build(ir::DType::BF16, 4));
}

TEST(IR, ConstantsAreExactBitPatterns) {
  ir::Graph g;
  ir::Builder b(g);
  g.set_outputs({b.constant(ir::DType::F32, 1.0, {2})});
  EXPECT_NE(g.to_mlir().find("dense<0x3F800000> : tensor<2xf32>"), std::string::npos);
}

TEST(IR, MultiResultValuesAreNumbered) {
  ir::Graph g;
  ir::Builder b(g);
  auto x = g.param({ir::DType::F32, {4, 5}});
  auto r = lowering::arg_reduce(b, x, 1, false, true);
  g.set_outputs(r);
  std::string text = g.to_mlir();
  EXPECT_NE(text.find(":2 = \"stablehlo.reduce\""), std::string::npos);
  EXPECT_NE(text.find("#1"), std::string::npos);
}

TEST(IR, BroadcastShapes) {
  EXPECT_EQ(ir::broadcast_shapes({3, 1}, {4}), (std::vector<int64_t>{3, 4}));
  EXPECT_THROW(ir::broadcast_shapes({3}, {4}), std::invalid_argument);
}

TEST(IR, ComplexValuesHaveNoMaximum) {
  // The CPU plugin's compiler crashed on stablehlo.maximum of complex values (a complex
  // scatter_reduce "mean" counted in the complex dtype): the builder refuses it instead.
  ir::Graph g;
  ir::Builder b(g);
  auto z = g.param({ir::DType::C64, {3}});
  EXPECT_THROW(b.binary("maximum", z, z), std::invalid_argument);
  EXPECT_THROW(b.binary("minimum", z, z), std::invalid_argument);
  auto x = g.param({ir::DType::F32, {3}});
  EXPECT_NO_THROW(b.binary("maximum", x, x));
}

TEST(IR, LongSumsAreTakenInBlocks) {
  ir::set_blocked_sums(true);
  auto reduces = [](std::vector<int64_t> dims, std::vector<int64_t> rdims, ir::DType d, const char* op) {
    ir::Graph g;
    ir::Builder b(g);
    auto x = g.param({d, dims});
    auto s = b.reduce_simple(x, b.constant(d, 0), rdims, op);
    g.set_outputs({s});
    std::string text = g.to_mlir();
    size_t n = 0;
    for (size_t at = text.find("\"stablehlo.reduce\""); at != std::string::npos;
         at = text.find("\"stablehlo.reduce\"", at + 1))
      ++n;
    return std::make_pair(n, b.dims(s));
  };
  // Short sums, integer sums and maxima: one reduce.
  EXPECT_EQ(reduces({3, 4095}, {1}, ir::DType::F32, "add").first, 1u);
  EXPECT_EQ(reduces({3, 100000}, {1}, ir::DType::S32, "add").first, 1u);
  EXPECT_EQ(reduces({3, 100000}, {1}, ir::DType::F32, "maximum").first, 1u);
  // 5000 = 40 blocks of 128 (the last padded): two; 2^21 = 16384 blocks, then 128: three.
  auto [two, shape] = reduces({3, 5000}, {1}, ir::DType::F32, "add");
  EXPECT_EQ(two, 2u);
  EXPECT_EQ(shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(reduces({1 << 21}, {0}, ir::DType::F32, "stablehlo.add").first, 3u);
  // Reduced dims that are not last (batch norm's statistics over N, H, W): the kept dim stays.
  auto [bn, bn_shape] = reduces({8, 3, 32, 32}, {0, 2, 3}, ir::DType::BF16, "add");
  EXPECT_EQ(bn, 2u);
  EXPECT_EQ(bn_shape, (std::vector<int64_t>{3}));
  ir::set_blocked_sums(false);  // as for a GPU or TPU plugin
  EXPECT_EQ(reduces({3, 5000}, {1}, ir::DType::F32, "add").first, 1u);
}
