// The tensor-parallel layers (parallel/tensor_parallel.h) over a tp group of every rank of
// the world, against float64 host references of the whole (unsplit) layer: each rank's
// outputs and its slices of the gradients. Biases and positions are non-zero, so a bias
// or position added on every rank instead of once would show; the vocabulary has padding,
// so padded columns must stay out of the softmax and get zero gradient.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "kernels/ops.h"
#include "tests/kernels/kernel_test_util.h"
#include "parallel/tensor_parallel.h"
#include "tests/common/mpi_test_util.h"

namespace trident {
namespace {

using testing::dev;
using testing::DevVec;
using testing::VecF;

using Mat = std::vector<double>;  // row-major host reference values

Mat random_values(uint64_t seed, size_t n) {
  Mat v(n);
  for (size_t i = 0; i < n; ++i) v[i] = test::seeded_value(seed, 0, i);  // same on every rank
  return v;
}

// Rows [r0, r0 + nr) (cols = all) or columns [c0, c0 + nc) of a rows x cols matrix.
std::vector<float> row_slice(const Mat& m, int cols, int r0, int nr) {
  std::vector<float> out(static_cast<size_t>(nr) * cols);
  for (int i = 0; i < nr; ++i)
    for (int j = 0; j < cols; ++j) out[static_cast<size_t>(i) * cols + j] = static_cast<float>(m[static_cast<size_t>(r0 + i) * cols + j]);
  return out;
}
std::vector<float> col_slice(const Mat& m, int rows, int cols, int c0, int nc) {
  std::vector<float> out(static_cast<size_t>(rows) * nc);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < nc; ++j) out[static_cast<size_t>(i) * nc + j] = static_cast<float>(m[static_cast<size_t>(i) * cols + c0 + j]);
  return out;
}
std::vector<float> to_float(const Mat& m) { return std::vector<float>(m.begin(), m.end()); }

// Max |a - b| / (1 + |b|) over the elements.
double max_err(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double worst = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - want[i]) /
                                (1.0 + std::fabs(static_cast<double>(want[i]))));
  }
  return worst;
}

constexpr double kTol = 1e-5;

// An MLP block: y = row(column(x)), the Megatron pairing, against
// h = x W1^T + b1, y = h W2^T + b2 and its backward from a given dy. With sequence
// parallelism x, y, dy and dx are this rank's N/tp rows: the input is gathered, the
// output reduce-scattered, the output gradient gathered and the input gradient
// reduce-scattered.
void check_column_then_row(int N, bool sequence_parallel) {
  Communicator& comm = test::device_world();
  const int tp = comm.size(), r = comm.rank();
  const int C = 6, F = 8 * 2;  // F splits over 1, 2, 4 and 8 ranks
  auto ops = make_cpu_ops(1);
  TensorParallel group(*ops, &comm, r, tp, sequence_parallel);
  const bool sp = group.sequence_parallel();
  const int n = group.local_rows(N), r0 = sp ? r * n : 0;  // this rank's rows of x, y
  ColumnParallelLinear column(group, C, F, "test.fc");
  RowParallelLinear row(group, F, C, "test.proj");
  const int Fl = F / tp;
  ASSERT_EQ(column.out_local(), Fl);
  ASSERT_EQ(row.in_local(), Fl);

  const Mat x = random_values(1, N * C), W1 = random_values(2, F * C), b1 = random_values(3, F),
            W2 = random_values(4, C * F), b2 = random_values(5, C), dy = random_values(6, N * C);
  // Reference, in double.
  Mat h(N * F), y(N * C), dh(N * F, 0), dx(N * C, 0), dW1(F * C, 0), db1(F, 0), dW2(C * F, 0),
      db2(C, 0);
  for (int n = 0; n < N; ++n) {
    for (int f = 0; f < F; ++f) {
      double s = b1[f];
      for (int c = 0; c < C; ++c) s += x[n * C + c] * W1[f * C + c];
      h[n * F + f] = s;
    }
    for (int c = 0; c < C; ++c) {
      double s = b2[c];
      for (int f = 0; f < F; ++f) s += h[n * F + f] * W2[c * F + f];
      y[n * C + c] = s;
    }
  }
  for (int n = 0; n < N; ++n) {
    for (int c = 0; c < C; ++c) {
      db2[c] += dy[n * C + c];
      for (int f = 0; f < F; ++f) {
        dh[n * F + f] += dy[n * C + c] * W2[c * F + f];
        dW2[c * F + f] += dy[n * C + c] * h[n * F + f];
      }
    }
  }
  for (int n = 0; n < N; ++n) {
    for (int f = 0; f < F; ++f) {
      db1[f] += dh[n * F + f];
      for (int c = 0; c < C; ++c) {
        dx[n * C + c] += dh[n * F + f] * W1[f * C + c];
        dW1[f * C + c] += dh[n * F + f] * x[n * C + c];
      }
    }
  }

  // This rank's slices (host vectors; dev() uploads them for a call and writes outputs back).
  const VecF x_f = to_float(x), w1 = row_slice(W1, C, r * Fl, Fl), bias1 = row_slice(b1, 1, r * Fl, Fl),
             w2 = col_slice(W2, C, F, r * Fl, Fl), bias2 = to_float(b2), dy_f = to_float(dy);
  const VecF x_rows = row_slice(x, C, r0, n), dy_rows = row_slice(dy, C, r0, n);
  VecF h_l(N * Fl), y_l(n * C), x_full = x_f, work(N * C);
  if (sp) {  // the column input: all-gathered from every rank's rows
    std::fill(x_full.begin(), x_full.end(), 0.0f);
    group.gather_rows(dev(*ops, x_rows), dev(*ops, x_full), N, C, "test input");
    EXPECT_EQ(max_err(x_full, x_f), 0.0) << "the gather is exact";
  }
  column.forward(dev(*ops, h_l), dev(*ops, x_full), dev(*ops, w1), dev(*ops, bias1), N);
  row.forward(dev(*ops, y_l), dev(*ops, h_l), dev(*ops, w2), dev(*ops, bias2), N,
              sp ? dev(*ops, work) : DevPtr());
  EXPECT_LT(max_err(h_l, col_slice(h, N, F, r * Fl, Fl)), kTol);
  EXPECT_LT(max_err(y_l, row_slice(y, C, r0, n)), kTol) << "row-parallel output, rank " << r;

  VecF dh_l(N * Fl), dx_full(N * C), dx_l(n * C), dw1(Fl * C), db1_l(Fl), dw2(C * Fl), db2_l(C);
  row.backward(dev(*ops, dh_l), dev(*ops, dw2), dev(*ops, db2_l), dev(*ops, dy_rows),
               dev(*ops, h_l), dev(*ops, w2), N, sp ? dev(*ops, work) : DevPtr());
  column.backward(dev(*ops, dx_full), dev(*ops, dw1), dev(*ops, db1_l), dev(*ops, dh_l),
                  dev(*ops, x_f), dev(*ops, w1), N);
  if (sp) {
    group.reduce_column_input_grad(dev(*ops, dx_full), dev(*ops, dx_l), N, C, "test dinput");
  } else {
    group.reduce_column_input_grad(dev(*ops, dx_full), DevPtr(), N, C, "test dinput");
    dx_l = dx_full;
  }
  EXPECT_LT(max_err(dh_l, col_slice(dh, N, F, r * Fl, Fl)), kTol);
  EXPECT_LT(max_err(dw2, col_slice(dW2, C, F, r * Fl, Fl)), kTol);
  EXPECT_LT(max_err(db2_l, to_float(db2)), kTol) << "replicated bias: full gradient";
  EXPECT_LT(max_err(dw1, row_slice(dW1, C, r * Fl, Fl)), kTol);
  EXPECT_LT(max_err(db1_l, row_slice(db1, 1, r * Fl, Fl)), kTol);
  EXPECT_LT(max_err(dx_l, row_slice(dx, C, r0, n)), kTol) << "column input gradient";
}

TEST(TensorParallelLayers, ColumnThenRowLinearMatchTheWholeLayer) {
  check_column_then_row(5, false);
}

TEST(TensorParallelLayers, SequenceParallelColumnThenRowMatchTheWholeLayer) {
  check_column_then_row(8, true);  // 8 rows split over 1, 2, 4 and 8 ranks
}

TEST(TensorParallelLayers, VocabParallelEmbeddingMatchesTheWholeTable) {
  Communicator& comm = test::device_world();
  const int tp = comm.size(), r = comm.rank();
  const int B = 2, T = 5, N = B * T, C = 4, V = 27, Vp = 32;  // rows 27..31 are padding
  auto ops = make_cpu_ops(1);
  TensorParallel group(*ops, &comm, r, tp);
  VocabParallelEmbedding embedding(group, Vp, C);
  const int Vl = Vp / tp;
  ASSERT_EQ(embedding.vocab_local(), Vl);
  ASSERT_EQ(embedding.vocab_begin(), r * Vl);

  std::vector<int32_t> tokens(N);
  for (int i = 0; i < N; ++i) tokens[i] = (i * 7 + 3) % V;
  tokens[3] = tokens[8];  // a repeated token accumulates twice
  const Mat wte = random_values(7, Vp * C), wpe = random_values(8, T * C),
            dout = random_values(9, N * C);
  Mat out(N * C), dwte(Vp * C, 0), dwpe(T * C, 0);
  for (int n = 0; n < N; ++n) {
    for (int c = 0; c < C; ++c) {
      out[n * C + c] = wte[tokens[n] * C + c] + wpe[(n % T) * C + c];
      dwte[tokens[n] * C + c] += dout[n * C + c];
      dwpe[(n % T) * C + c] += dout[n * C + c];
    }
  }

  const DevVec<int32_t> tok(*ops, tokens);
  const VecF table = row_slice(wte, C, r * Vl, Vl), pos = to_float(wpe);
  VecF out_l(N * C);
  embedding.forward(dev(*ops, out_l), tok, dev(*ops, table), dev(*ops, pos), B, T);
  EXPECT_LT(max_err(out_l, to_float(out)), kTol) << "positions added once";

  VecF dtable(Vl * C), dpos(T * C);
  embedding.backward(dev(*ops, dtable), dev(*ops, dpos), dev(*ops, to_float(dout)), tok, B, T);
  EXPECT_LT(max_err(dtable, row_slice(dwte, C, r * Vl, Vl)), kTol);
  EXPECT_LT(max_err(dpos, to_float(dwpe)), kTol);
}

TEST(TensorParallelLayers, VocabParallelCrossEntropyMatchesTheWholeSoftmax) {
  Communicator& comm = test::device_world();
  const int tp = comm.size(), r = comm.rank();
  const int N = 7, V = 27, Vp = 32;
  const float dloss = 0.5f;
  auto ops = make_cpu_ops(1);
  TensorParallel group(*ops, &comm, r, tp);
  VocabParallelCrossEntropy xent(group, V, Vp);
  const int Vl = Vp / tp;

  Mat logits = random_values(10, N * Vp);
  for (double& v : logits) v *= 4.0;  // a peaked softmax: the max subtraction matters
  std::vector<int32_t> targets(N);
  for (int n = 0; n < N; ++n) targets[n] = (n * 11 + 5) % V;
  Mat losses(N), dlogits(N * Vp, 0);  // the op table's float64 reference; padding 0
  for (int n = 0; n < N; ++n)
    losses[n] = testing::op_table::ref_xent_row(&logits[n * Vp], V, targets[n], dloss,
                                                &dlogits[n * Vp]);

  const DevVec<int32_t> tgt(*ops, targets);
  VecF local = col_slice(logits, N, Vp, r * Vl, Vl), losses_l(N), row_max(N), sums(2 * N);
  {
    // Kept from forward to backward, as the model keeps them; the backward is in place.
    DevVec<float> d_local(*ops, local), d_row_max(*ops, row_max), d_sums(*ops, sums);
    xent.forward(dev(*ops, losses_l), d_row_max, d_sums, d_local, tgt, N);
    EXPECT_LT(max_err(losses_l, to_float(losses)), kTol);
    xent.backward(d_local, d_local, d_row_max, d_sums, tgt, dloss, N);
  }
  EXPECT_LT(max_err(local, col_slice(dlogits, N, Vp, r * Vl, Vl)), kTol)
      << "rank " << r << " (padded columns must be 0)";
}

}  // namespace
}  // namespace trident
