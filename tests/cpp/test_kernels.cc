// The host kernels' loops (csrc/kernels/attention_tile.inc, few_row_product.inc), each
// instruction-set variant this CPU runs, against a double-precision reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/attention_tile.h"
#include "kernels/few_row_product.h"
#include "kernels/host_kernels.h"

namespace torch_pjrt::kernels {
namespace {

struct Batch {
  int64_t tiles, rows, heads, kv_heads, head_size, block_size, table, blocks;
  std::vector<float> q, cache;  // [S, Q, H, D], [2, N, KVH, B, D]
  std::vector<int64_t> block_rows, positions;  // [S, table], [S, Q]
};

Batch make_batch(int64_t tiles, int64_t rows, int64_t heads, int64_t kv_heads, int64_t head_size,
                 int64_t block_size, int64_t table, unsigned seed) {
  Batch b{tiles, rows, heads, kv_heads, head_size, block_size, table, tiles * table + 1, {}, {}, {}, {}};
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal;
  b.q.resize(tiles * rows * heads * head_size);
  for (float& x : b.q) x = normal(gen);
  b.cache.resize(2 * b.blocks * kv_heads * block_size * head_size);
  for (float& x : b.cache) x = normal(gen);
  for (int64_t s = 0; s < tiles; ++s) {
    for (int64_t t = 0; t < table; ++t) b.block_rows.push_back(1 + s * table + (t * 7 + s) % table);  // shuffled
    // Consecutive positions ending somewhere in the table, the last rows padding in odd tiles.
    const int64_t last = std::uniform_int_distribution<int64_t>(rows - 1, table * block_size - 1)(gen);
    for (int64_t r = 0; r < rows; ++r)
      b.positions.push_back(s % 2 == 1 && r >= rows / 2 ? -1 : last - (rows - 1) + r);
  }
  return b;
}

// Row by row in double: softmax over the positions up to the row's own.
std::vector<double> reference(const Batch& b, double scale) {
  std::vector<double> out(b.q.size(), 0.0);
  const int64_t D = b.head_size, group = b.heads / b.kv_heads;
  for (int64_t s = 0; s < b.tiles; ++s) {
    for (int64_t r = 0; r < b.rows; ++r) {
      const int64_t pos = b.positions[s * b.rows + r];
      for (int64_t h = 0; h < b.heads; ++h) {
        const float* q = &b.q[((s * b.rows + r) * b.heads + h) * D];
        std::vector<double> scores;
        std::vector<const float*> values;
        for (int64_t p = 0; p <= pos; ++p) {
          const int64_t block = b.block_rows[s * b.table + p / b.block_size];
          const int64_t at = ((block * b.kv_heads + h / group) * b.block_size + p % b.block_size) * D;
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += double(q[d]) * b.cache[at + d];
          scores.push_back(dot * scale);
          values.push_back(&b.cache[b.blocks * b.kv_heads * b.block_size * D + at]);
        }
        if (scores.empty()) continue;
        double top = scores[0], total = 0;
        for (double x : scores) top = std::max(top, x);
        for (double& x : scores) total += (x = std::exp(x - top));
        double* o = &out[((s * b.rows + r) * b.heads + h) * D];
        for (size_t j = 0; j < scores.size(); ++j)
          for (int64_t d = 0; d < D; ++d) o[d] += scores[j] / total * values[j][d];
      }
    }
  }
  return out;
}

void run(AttendTile attend, const Batch& b, float scale, std::vector<float>& out) {
  out.assign(b.q.size(), 123.f);  // every element must be written, padding rows with zeros
  const int64_t half = b.blocks * b.kv_heads * b.block_size * b.head_size;
  TileWork w{b.q.data(), b.cache.data(), b.cache.data() + half, out.data(), {b.block_rows.data(), true},
             {b.positions.data(), true}, b.rows, b.heads, b.head_size, b.blocks, b.kv_heads, b.block_size,
             b.table, b.heads / b.kv_heads, scale, 0.f, 0};
  for (int64_t s = 0; s < b.tiles; ++s)
    for (int64_t k = 0; k < b.kv_heads; ++k) attend(w, s, k);
}

TEST(AttentionTile, EveryVariantMatchesDoubleOnDecodeAndPrefillTiles) {
  if (host_kernel_handlers().empty()) GTEST_SKIP() << "built without XLA's FFI headers: no host kernels";
  ASSERT_FALSE(host_kernel_variants().empty());
  // Decode (one row, lane by lane), a prefill tile of 17 rows (lanes in vectors, a second vector
  // mostly padding), grouped heads, head sizes that are not a whole number of vectors; lane by
  // lane with rows of different context lengths (3 rows of 2 heads) and with 7 heads to a
  // key/value head (values added four, two and one lane at a time).
  struct Case { int64_t tiles, rows, heads, kv_heads, head_size, block_size, table; };
  for (const Case& c : {Case{6, 1, 4, 2, 64, 16, 8}, Case{4, 17, 4, 4, 80, 16, 12}, Case{3, 8, 8, 2, 24, 4, 40},
                        Case{5, 3, 6, 3, 40, 8, 10}, Case{4, 1, 7, 1, 72, 16, 6}}) {
    const Batch b = make_batch(c.tiles, c.rows, c.heads, c.kv_heads, c.head_size, c.block_size, c.table, 7);
    const float scale = 1.f / std::sqrt(float(c.head_size));
    const std::vector<double> expected = reference(b, scale);
    double scale_of_values = 0;
    for (double x : expected) scale_of_values = std::max(scale_of_values, std::abs(x));
    for (const auto& [name, attend, multiply] : host_kernel_variants()) {
      std::vector<float> got;
      run(attend, b, scale, got);
      double worst = 0;
      for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - expected[i]));
      // Float32 over contexts of up to a few hundred positions: a few hundred roundings at most.
      EXPECT_LE(worst, 256 * 1.2e-7 * scale_of_values) << name << " rows=" << c.rows << " head_size=" << c.head_size;
    }
  }
}

TEST(FewRowProduct, EveryVariantMatchesDoubleInBothWeightLayouts) {
  if (host_kernel_handlers().empty()) GTEST_SKIP() << "built without XLA's FFI headers: no host kernels";
  ASSERT_FALSE(host_kernel_variants().empty());
  // Rows: one, a partial and a whole register group, the most the kernel takes; depths and
  // columns that are and are not whole vectors, blocks and panels (the last panel narrower,
  // columns past the last whole vector).
  struct Case { int64_t rows, depth, columns; };
  std::mt19937 gen(11);
  std::normal_distribution<float> normal;
  for (const Case& c : {Case{1, 512, 192}, Case{3, 67, 65}, Case{6, 130, 200}, Case{7, 64, 64}, Case{16, 200, 131},
                        Case{5, 1, 17}, Case{16, 5, 3}}) {
    std::vector<float> x(c.rows * c.depth), w(c.depth * c.columns), wt(w.size());
    for (float& v : x) v = normal(gen);
    for (float& v : w) v = normal(gen);
    for (int64_t k = 0; k < c.depth; ++k)
      for (int64_t n = 0; n < c.columns; ++n) wt[n * c.depth + k] = w[k * c.columns + n];
    std::vector<double> exact(c.rows * c.columns), magnitude(exact.size());
    for (int64_t r = 0; r < c.rows; ++r)
      for (int64_t n = 0; n < c.columns; ++n)
        for (int64_t k = 0; k < c.depth; ++k) {
          const double term = double(x[r * c.depth + k]) * w[k * c.columns + n];
          exact[r * c.columns + n] += term;
          magnitude[r * c.columns + n] += std::abs(term);
        }
    const int64_t panels = (c.columns + kProductPanelColumns - 1) / kProductPanelColumns;
    for (const auto& [name, attend, multiply] : host_kernel_variants()) {
      for (bool transposed : {false, true}) {
        std::vector<float> y(exact.size(), std::nanf(""));
        const ProductWork work{x.data(), transposed ? wt.data() : w.data(), y.data(), c.rows, c.depth, c.columns, transposed};
        // Work items of three panels, as the handler hands out (the last one past the end).
        for (int64_t p = 0; p < panels; p += 3) multiply(work, p, p + 3);
        for (size_t i = 0; i < y.size(); ++i) {
          // A float32 sum of `depth` products: at most depth roundings of the magnitudes' sum.
          ASSERT_LE(std::abs(y[i] - exact[i]), (c.depth + 1) * 6e-8 * magnitude[i] + 1e-30)
              << name << (transposed ? " [N,K]" : " [K,N]") << " rows=" << c.rows << " depth=" << c.depth
              << " columns=" << c.columns << " element " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace torch_pjrt::kernels
