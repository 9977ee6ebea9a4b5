// The kernels of a packed decoder layer as plain functions over raw float32 rows, for layer_step.cpp: each
// kernel's op (torch.ops.eaglespec.*) is a wrapper that checks its tensors and calls the same function, so the
// one-call layer computes exactly what the ops compute without building a tensor view or an output tensor per
// step (~9.5 us a layer of views and reshapes through the dispatcher before, ~0.3 ms of a 5 ms decode forward
// on a 2-core EPYC).
#pragma once

#include <ATen/ATen.h>
#include <cstdint>

namespace eaglespec_kernels {

// rms_norm.cpp: y [rows, h] = rms_norm(x [rows, h]) * w (rows contiguous).
void rms_norm_rows(const float* x, const float* w, float* y, int64_t rows, int64_t h, float eps);

// w4a8.cpp: y [m, n] = x [m, k] (rows contiguous) times the packed weight (wq, scale, zero), plus res [m, n]
// where res is not null. Checks the weight's layout against k; returns n.
int64_t w4a8_rows(const float* x, int64_t m, int64_t k, const at::Tensor& wq, const at::Tensor& scale,
                  const at::Tensor& zero, float* y, const float* res);

// layer_elementwise.cpp. rotary_rows: for each of `items` = B * T positions (item i = b * T + t), its `heads`
// heads of d values at x + i_b * x_b + i_t * x_t + head * d, rotated with the tables at cos / sin + b * c_b +
// t * c_t (sin likewise with s_b, s_t), into y [items, heads, d].
void rotary_rows(const float* x, int64_t x_b, int64_t x_t, int64_t batch, int64_t t, int64_t heads, int64_t d,
                 const float* cos, int64_t c_b, int64_t c_t, const float* sin, int64_t s_b, int64_t s_t, float* y);
// silu_mul_rows: y [rows, n] = silu(g) * u, row r of g at g + r * g_row (u likewise).
void silu_mul_rows(const float* g, int64_t g_row, const float* u, int64_t u_row, float* y, int64_t rows, int64_t n);

// row_attention.cpp: the attention of q [B, H, T, D] (strides q0, q1, q2) over the cache rows rows[b] (or b when
// rows is null) of keys / values (float32, or float16 bits when half; strides k0..k2, v0..v2; slots [0, s)),
// under mask [B or 1, 1, T, s] (m_b = 0 for one shared mask; null: every slot visible), into out [B, T, H, D].
struct Attend {
  const float* q;
  int64_t q0, q1, q2;
  const void *k, *v;
  bool half;
  int64_t k0, k1, k2, v0, v1, v2;
  const int64_t* rows;
  const bool* mask;
  int64_t m_b, m_t;
  float* out;
  int64_t b, h, t, d, hkv, s;
};
void row_attention_rows(const Attend& a);

}  // namespace eaglespec_kernels
