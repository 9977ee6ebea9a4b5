# What the one-call layer of main before session 28 spent on tensor views per layer, timed from C++ alone: the
# views and reshapes its code made for one decode token of the default model (10 narrows, 7 reshapes, a transpose,
# 2 views), and the 9 output tensors it allocated, 20000 times each, three rounds, inside torch.inference_mode.
#   python views_cost.py
import time, torch
from torch.utils.cpp_extension import load_inline
src = r'''
#include <torch/extension.h>
#include <chrono>
double views(torch::Tensor qkv, torch::Tensor kc, int64_t iters) {
  auto t0 = std::chrono::steady_clock::now();
  int64_t acc = 0;
  for (int64_t i = 0; i < iters; ++i) {
    auto a = qkv.view({1, 1, 15, 64});
    auto b = a.narrow(2, 0, 12); auto c = a.narrow(2, 12, 3); auto d = b.narrow(2, 9, 3); auto e = b.narrow(2, 0, 9).transpose(1, 2);
    auto k = kc.narrow(0, 0, 1).narrow(2, 0, 257); auto v = kc.narrow(0, 0, 1).narrow(2, 0, 257);
    auto g = qkv.reshape({-1, 960}); auto h = g.reshape({1, 1, 960}); auto i2 = qkv.reshape({-1, 960}).view({1,1,960});
    auto r1 = qkv.reshape({-1, 960}); auto r2 = qkv.reshape({-1, 960}); auto r3 = qkv.reshape({-1, 960});
    auto n1 = qkv.narrow(-1, 0, 480); auto n2 = qkv.narrow(-1, 480, 480);
    acc += e.size(1) + k.size(2) + v.size(2) + h.size(2) + i2.size(0) + r1.size(0) + r2.size(0) + r3.size(0) + n1.size(1) + n2.size(1) + c.size(2) + d.size(2);
  }
  auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::micro>(t1 - t0).count() / iters + acc * 0.0;
}
double empties(torch::Tensor x, int64_t iters) {
  auto t0 = std::chrono::steady_clock::now();
  int64_t acc = 0;
  for (int64_t i = 0; i < iters; ++i) {
    auto a = at::empty({1, 576}, x.options()); auto b = at::empty({1, 960}, x.options()); auto c = at::empty({1,1,15,64}, x.options());
    auto d = at::empty({1, 1, 9, 64}, x.options()); auto e = at::empty({1, 576}, x.options()); auto f = at::empty({1, 3072}, x.options());
    auto g = at::empty({1, 1536}, x.options()); auto h = at::empty({1, 576}, x.options()); auto k = at::empty({1, 576}, x.options());
    acc += a.numel() + b.numel() + c.numel() + d.numel() + e.numel() + f.numel() + g.numel() + h.numel() + k.numel();
  }
  auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::micro>(t1 - t0).count() / iters + acc * 0.0;
}
'''
m = load_inline("views_cost", cpp_sources=src, functions=["views", "empties"], extra_cflags=["-O2"])
torch.set_num_threads(2)
qkv = torch.randn(1, 960); kc = torch.randn(1, 3, 300, 64).half()
for _ in range(3):
  with torch.inference_mode():
    print("views us/layer %.2f  empties us/layer %.2f" % (m.views(qkv, kc, 20000), m.empties(qkv, 20000)))
