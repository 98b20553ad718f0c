// mxmoe_ep_test: multi-process test of expert-parallel dispatch/combine (include/mxmoe/ep.h).
// One process per GPU; start it with scripts/ep_launch.sh NGPU build/mxmoe_ep_test (or run it
// bare for R = 1). Environment: RANK, WORLD_SIZE, LOCAL_RANK, MXMOE_EP_ID_FILE (NCCL unique id,
// written by rank 0), MXMOE_EP_SEED (shared by all ranks; the launcher draws a fresh one),
// MXMOE_EP_TIMED_CTAS (num_ctas values of the timed case, comma-separated; default 0 = one per SM). The timed
// case also measures the P2P copy reference (copy engine into the peer's window) in the same run.
//
// Per case, on every rank: random BF16 tokens x [T, H] (T may differ per rank), random top-k ids
// (some invalid), weights w; quantize_mxfp8(x) → dispatch → stand-in expert on the received rows
// → combine → out. The stand-in expert of expert e is y = bf16(deq(q) · c_e) (one kernel, used on
// both paths). Reference on this GPU alone, with all experts: the same kernel on the local
// quantized rows → moe_combine → out_ref. Checks (bitwise): out == out_ref; a second run gives the
// same bytes; recv_local_ids equal the routing every rank regenerates on the host from the shared
// seed. One more case runs the real m-grouped MXFP8 GEMM (exact mode) as the expert, through
// moe_plan over recv_local_ids and EpComm::gather_recv_mx, against moe_plan → quantize_mxfp8_gather
// → GEMM → moe_combine on one GPU. Exits 0 when all pass, 1 on a mismatch, 2 on an error; skips (exit 0) with fewer GPUs than
// WORLD_SIZE.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "mxmoe/dequantize.h"
#include "mxmoe/ep.h"
#include "mxmoe/gemm.h"
#include "mxmoe/moe_plan.h"
#include "mxmoe/moe_ops.h"
#include "mxmoe/quantize.h"
#include "ep/ep_test_util.h"

namespace {

using ep_test::bf16_bits;
using ep_test::Dev;
using ep_test::median;

// ---- the stand-in expert (one kernel for both paths) -----------------------------------------
__device__ float deq_e4m3(uint8_t q, uint8_t s) {
  const float v = __half2float(__half(__nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(q), __NV_E4M3)));
  if (s == 0xFF) return __int_as_float(0x7FC00000);
  const float sc = s == 0 ? __int_as_float(0x00400000) : __int_as_float(int(s) << 23);  // 2^(s-127)
  return __fmul_rn(v, sc);
}

// y[u·k + j, :] = bf16(deq(row u) · coef[id + id_base]) for every slot with 0 <= id < id_count.
__global__ void standin_expert(const uint8_t* data, int64_t data_ld, const uint8_t* scales, int64_t scales_ld,
                               const int32_t* ids, int64_t n_src, int k, int id_base, int id_count,
                               const float* coef, int hidden, __nv_bfloat16* y) {
  for (int64_t u = blockIdx.x; u < n_src; u += gridDim.x) {
    for (int j = 0; j < k; ++j) {
      const int id = ids[u * k + j];
      if (id < 0 || id >= id_count) continue;
      const float c = coef[id + id_base];
      for (int h = threadIdx.x; h < hidden; h += blockDim.x) {
        const float v = deq_e4m3(data[u * data_ld + h], scales[u * scales_ld + h / 32]);
        y[(u * k + j) * hidden + h] = __float2bfloat16_rn(__fmul_rn(v, c));
      }
    }
  }
}

__global__ void rows_from_local_ids(const int32_t* local_ids, int64_t n, int32_t* row_of) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    row_of[i] = local_ids[i] >= 0 ? int32_t(i) : -1;
}

// ---- inputs, regenerated identically on every rank --------------------------------------------
enum class Route { kUniform, kAllToRank0 };

struct Case {
  const char* name;
  int hidden, top_k, experts_per_rank;
  int64_t max_tokens;
  int tokens_drop_per_rank;  // T(rank) = max_tokens - rank · drop (>= 0); -1: the last rank has 0
  Route route;
  double invalid_frac;
  int num_ctas;
  bool timed;
  bool gemm = false;  // expert = the real m-grouped MXFP8 GEMM (exact mode) instead of the stand-in
};

int64_t tokens_of(const Case& c, int rank, int world) {
  if (c.tokens_drop_per_rank < 0) return rank == world - 1 ? 0 : c.max_tokens;
  return std::max<int64_t>(0, c.max_tokens - int64_t(rank) * c.tokens_drop_per_rank);
}

std::vector<int32_t> routing_of(const Case& c, int rank, int world, uint32_t seed) {
  const int E = c.experts_per_rank * world, k = c.top_k;
  const int64_t T = tokens_of(c, rank, world);
  std::mt19937 rng(seed * 7919u + uint32_t(rank) * 104729u + 17u);
  std::vector<int32_t> ids(size_t(T * k));
  std::vector<int> pool(E);
  for (int64_t t = 0; t < T; ++t) {
    for (int e = 0; e < E; ++e) pool[e] = e;
    const int choices = c.route == Route::kAllToRank0 ? c.experts_per_rank : E;
    std::shuffle(pool.begin(), pool.begin() + choices, rng);
    for (int j = 0; j < k; ++j) {
      int id = pool[j];
      if (std::uniform_real_distribution<double>(0, 1)(rng) < c.invalid_frac) id = (rng() % 2) ? -1 : E + 3;
      ids[size_t(t * k + j)] = id;
    }
  }
  return ids;
}

struct Outputs {
  std::vector<uint16_t> out, out_ref;
  std::vector<int32_t> local_ids;
  float dispatch_ms = 0, combine_ms = 0;        // median of single calls (host sync between: rank skew included)
  float dispatch_b2b_ms = 0, combine_b2b_ms = 0;  // per call, kBackToBack calls in a row (skew paid once)
  float send_b2b_ms = 0;                          // combine_send alone (the rows' transfer, no local sum)
};

constexpr int kBackToBack = 20;

Outputs run_case(mxmoe::EpComm& ep, const Case& c, uint32_t seed, int reps) {
  const int R = ep.world_size(), rank = ep.rank(), H = c.hidden, k = c.top_k;
  const int E = c.experts_per_rank * R;
  const int64_t T = tokens_of(c, rank, R), maxT = c.max_tokens;
  std::mt19937 rng(seed + 31u * uint32_t(rank) + 5u);
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<uint16_t> hx(size_t(std::max<int64_t>(T, 1) * H));
  for (auto& v : hx) v = bf16_bits(g(rng) * std::ldexp(1.f, int(rng() % 9) - 4));
  std::vector<float> hw(size_t(std::max<int64_t>(T, 1) * k));
  std::vector<float> hc(static_cast<size_t>(E));
  for (auto& v : hw) v = std::uniform_real_distribution<float>(0.05f, 1.f)(rng);
  std::mt19937 rng_c(seed + 99u);  // expert coefficients: same on every rank
  for (auto& v : hc) v = std::uniform_real_distribution<float>(0.25f, 4.f)(rng_c);
  std::vector<int32_t> hids = routing_of(c, rank, R, seed);
  hids.resize(size_t(std::max<int64_t>(T, 1) * k), -1);

  Dev<__nv_bfloat16> x(hx.size()), out(size_t(std::max<int64_t>(T, 1) * H)), out_ref(out.n);
  Dev<float> w(hw.size()), coef(hc.size());
  Dev<int32_t> ids(hids.size()), home(hids.size()), row_of(size_t(R * maxT * k));
  Dev<uint8_t> q(size_t(std::max<int64_t>(T, 1) * H)), qs(size_t(std::max<int64_t>(T, 1) * H / 32));
  Dev<__nv_bfloat16> y(size_t(R * maxT * k) * H), y_ref(size_t(std::max<int64_t>(T, 1) * k) * H);
  x.up(std::vector<__nv_bfloat16>(reinterpret_cast<__nv_bfloat16*>(hx.data()),
                                  reinterpret_cast<__nv_bfloat16*>(hx.data()) + hx.size()));
  w.up(hw);
  coef.up(hc);
  ids.up(hids);
  std::vector<int32_t> hhome(hids.size());
  for (size_t i = 0; i < hids.size(); ++i) hhome[i] = (hids[i] >= 0 && hids[i] < E) ? int32_t(i) : -1;
  home.up(hhome);

  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  mxmoe::MxOut mx;
  mx.data = q.p;
  mx.scales = qs.p;
  if (T > 0) mxmoe::quantize_mxfp8(x.p, 1, T, H, &mx, nullptr, mxmoe::ScaleMode::kRceil, st);

  // Reference: this GPU, all experts.
  if (T > 0) {
    standin_expert<<<int(std::min<int64_t>(T, 4096)), 256, 0, st>>>(q.p, H, qs.p, H / 32, ids.p, T, k, 0, E, coef.p,
                                                                    H, y_ref.p);
    CK(cudaGetLastError());
    mxmoe::moe_combine(y_ref.p, T * k, H, home.p, w.p, T, k, nullptr, out_ref.p, st);
  }

  // EP path (reps times; the last result is kept, all must agree).
  Outputs o;
  std::vector<float> td, tc;
  cudaEvent_t e0, e1, e2;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaEventCreate(&e2));
  const mxmoe::EpWindowLayout& L = ep.layout();
  std::vector<uint16_t> first;
  for (int rep = 0; rep < reps; ++rep) {
    CK(cudaEventRecord(e0, st));
    ep.dispatch(q.p, qs.p, ids.p, T, st);
    CK(cudaEventRecord(e1, st));
    standin_expert<<<int(std::min<int64_t>(R * maxT, 8192)), 256, 0, st>>>(
        ep.recv_records(), L.record_bytes, ep.recv_records() + L.data_bytes, L.record_bytes, ep.recv_local_ids(),
        R * maxT, k, rank * c.experts_per_rank, c.experts_per_rank, coef.p, H, y.p);
    CK(cudaGetLastError());
    rows_from_local_ids<<<256, 256, 0, st>>>(ep.recv_local_ids(), R * maxT * k, row_of.p);
    CK(cudaGetLastError());
    CK(cudaEventRecord(e2, st));
    ep.combine(y.p, R * maxT * k, row_of.p, w.p, T, out.p, st);
    CK(cudaEventRecord(e0, st));  // reuse e0 as the end of combine below
    ep.check(st);
    float a = 0, b = 0;
    CK(cudaEventElapsedTime(&a, e1, e2));  // (stand-in, not reported)
    (void)a;
    CK(cudaEventElapsedTime(&b, e2, e0));
    tc.push_back(b);
    o.out = out.down<uint16_t>(size_t(T * H));
    if (rep == 0) first = o.out;
    else if (first != o.out) {
      std::printf("[rank %d] %s: FAIL rerun %d differs from run 0 (not deterministic)\n", rank, c.name, rep);
      o.out.clear();
      break;
    }
  }
  // Dispatch alone, timed with events (barriers keep the ranks in step).
  for (int rep = 0; rep < (c.timed ? 20 : 0); ++rep) {
    CK(cudaEventRecord(e1, st));
    ep.dispatch(q.p, qs.p, ids.p, T, st);
    CK(cudaEventRecord(e2, st));
    ep.check(st);
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e1, e2));
    td.push_back(ms);
  }
  o.dispatch_ms = median(td);
  o.combine_ms = median(tc);
  if (c.timed) {
    // kBackToBack calls in a row between two events: the per-call barriers keep the ranks in step,
    // so the ranks' launch skew (in the single-call figures above: each is preceded by a host sync)
    // is paid once. Same bytes; the combine repeats the last stand-in output (its reads are stable).
    const auto back_to_back = [&](auto&& call) {
      call();  // warm-up
      CK(cudaEventRecord(e1, st));
      for (int i = 0; i < kBackToBack; ++i) call();
      CK(cudaEventRecord(e2, st));
      ep.check(st);
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, e1, e2));
      return ms / kBackToBack;
    };
    o.dispatch_b2b_ms = back_to_back([&] { ep.dispatch(q.p, qs.p, ids.p, T, st); });
    o.combine_b2b_ms = back_to_back([&] { ep.combine(y.p, R * maxT * k, row_of.p, w.p, T, out.p, st); });
    o.send_b2b_ms = back_to_back([&] { ep.combine_send(y.p, R * maxT * k, row_of.p, T, st); });
  }
  o.out_ref = out_ref.down<uint16_t>(size_t(T * H));
  o.local_ids = std::vector<int32_t>(size_t(R * maxT * k));
  CK(cudaMemcpy(o.local_ids.data(), ep.recv_local_ids(), o.local_ids.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  CK(cudaEventDestroy(e2));
  CK(cudaStreamDestroy(st));
  return o;
}

bool check_case(const Case& c, const Outputs& o, int rank, int world, uint32_t seed) {
  const int H = c.hidden, k = c.top_k, El = c.experts_per_rank, E = El * world;
  const int64_t T = tokens_of(c, rank, world), maxT = c.max_tokens;
  bool ok = true;
  // Received routing against the host's regeneration of every rank's ids.
  for (int s = 0; s < world && ok; ++s) {
    const std::vector<int32_t> ids = routing_of(c, s, world, seed);
    const int64_t Ts = tokens_of(c, s, world);
    for (int64_t t = 0; t < maxT && ok; ++t)
      for (int j = 0; j < k; ++j) {
        const int id = t < Ts ? ids[size_t(t * k + j)] : -1;
        const int want = (id >= 0 && id < E && id / El == rank) ? id - rank * El : -1;
        const int got = o.local_ids[size_t((s * maxT + t) * k + j)];
        if (got != want) {
          std::printf("[rank %d] %s: FAIL local_ids[src %d, t %lld, j %d] = %d, want %d\n", rank, c.name, s,
                      (long long)t, j, got, want);
          ok = false;
          break;
        }
      }
  }
  if (o.out.size() != size_t(T * H)) return false;
  int64_t bad = 0;
  for (int64_t i = 0; i < T * H; ++i)
    if (o.out[size_t(i)] != o.out_ref[size_t(i)]) {
      if (bad++ == 0)
        std::printf("[rank %d] %s: FAIL out[%lld, %lld] = 0x%04x, single-GPU 0x%04x\n", rank, c.name,
                    (long long)(i / H), (long long)(i % H), o.out[size_t(i)], o.out_ref[size_t(i)]);
    }
  if (bad) {
    std::printf("[rank %d] %s: %lld of %lld outputs differ (seed %u)\n", rank, c.name, (long long)bad,
                (long long)(T * H), seed);
    ok = false;
  }
  return ok;
}


// ---- the real expert GEMM (exact mode) as the expert: y = deq(A) · deq(W[e])ᵀ, W [E, H, H] ------
// Reference: moe_plan over this rank's ids with all E experts → quantize_mxfp8_gather → GEMM →
// moe_combine. EP: dispatch → moe_plan over recv_local_ids (E/R experts) → gather_recv_mx → GEMM
// on this rank's slice of W → combine. Bitwise equal if the GEMM's value for a row does not depend
// on which rows share its tile (each output element is one thread's fixed-order sum).
struct Plan {
  int64_t cap;
  Dev<int32_t> counts, offsets, padded, row_of, row_index;
  Dev<uint8_t> ws;
  Plan(int64_t tokens, int k, int E)
      : cap(mxmoe::moe_plan_capacity(tokens, k, E)), counts(size_t(E)), offsets(size_t(E + 1)),
        padded(size_t(E + 1)), row_of(size_t(std::max<int64_t>(tokens, 1) * k)), row_index(size_t(cap)),
        ws(std::max<size_t>(1, mxmoe::moe_plan_workspace_bytes(tokens, k, E))) {}
  mxmoe::MoePlan view() const { return {counts.p, offsets.p, padded.p, row_of.p, row_index.p}; }
};

// Exact mode reads BF16 images: made here from the MX operands (rows past the plan's used rows are
// dequantized too; the GEMM never reads them).
void gemm_expert_out(const uint8_t* a_data, const uint8_t* a_scales, int64_t cap,
                                      const uint8_t* w_data, const uint8_t* w_scales, int experts, int H,
                                      const int32_t* offsets, Dev<__nv_bfloat16>& y, cudaStream_t st) {
  Dev<__nv_bfloat16> a_img(size_t(cap) * H), w_img(size_t(experts) * H * H);
  CK(cudaDeviceSynchronize());  // Dev's poison memset (legacy stream) is done before st writes
  mxmoe::dequantize_mxfp8_bf16(a_data, a_scales, cap, H, a_img.p, st);
  mxmoe::dequantize_mxfp8_bf16(w_data, w_scales, int64_t(experts) * H, H, w_img.p, st);
  mxmoe::MxOperand a, b;
  a.image = a_img.p;
  b.image = w_img.p;
  mxmoe::GemmOptions opt;
  opt.mode = mxmoe::GemmMode::kExact;
  opt.stream = st;
  mxmoe::m_grouped_mxfp8_gemm_nt(a, cap, b, experts, H, H, offsets, y.p, opt);
  CK(cudaStreamSynchronize(st));  // the images are freed on return
}

bool run_gemm_case(mxmoe::EpComm& ep, const Case& c, uint32_t seed) {
  const int R = ep.world_size(), rank = ep.rank(), H = c.hidden, k = c.top_k, El = c.experts_per_rank;
  const int E = El * R;
  const int64_t T = tokens_of(c, rank, R), maxT = c.max_tokens;
  std::mt19937 rng(seed + 131u * uint32_t(rank) + 7u);
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<uint16_t> hx(size_t(T * H));
  for (auto& v : hx) v = bf16_bits(g(rng));
  std::vector<float> hw(size_t(T * k));
  for (auto& v : hw) v = std::uniform_real_distribution<float>(0.05f, 1.f)(rng);
  std::mt19937 rng_w(seed + 4242u);  // weights: same on every rank
  std::vector<uint16_t> hW(size_t(E) * H * H);
  for (auto& v : hW) v = bf16_bits(g(rng_w) * 0.05f);
  const std::vector<int32_t> hids = routing_of(c, rank, R, seed);

  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  Dev<uint16_t> x(hx.size()), W(hW.size()), out(size_t(T * H)), out_ref(size_t(T * H));
  Dev<float> w(hw.size());
  Dev<int32_t> ids(hids.size());
  x.up(hx);
  W.up(hW);
  w.up(hw);
  ids.up(hids);
  // Weights, row-wise MX (every rank quantizes all E; EP uses its slice).
  Dev<uint8_t> wq(hW.size()), wqs(hW.size() / 32);
  mxmoe::MxOut wmx;
  wmx.data = wq.p;
  wmx.scales = wqs.p;
  mxmoe::quantize_mxfp8(reinterpret_cast<const __nv_bfloat16*>(W.p), E, H, H, &wmx, nullptr,
                        mxmoe::ScaleMode::kRceil, st);
  // Reference: all experts on this GPU.
  Plan pr(T, k, E);
  mxmoe::moe_plan(ids.p, T, k, E, pr.cap, pr.ws.p, pr.ws.n, pr.view(), st);
  Dev<uint8_t> ar(size_t(pr.cap) * H), ars(size_t(pr.cap) * H / 32);
  mxmoe::MxOut amx;
  amx.data = ar.p;
  amx.scales = ars.p;
  mxmoe::quantize_mxfp8_gather(reinterpret_cast<const __nv_bfloat16*>(x.p), T, H, pr.row_index.p, pr.cap,
                               pr.padded.p + E, &amx, nullptr, mxmoe::ScaleMode::kRceil, st);
  Dev<__nv_bfloat16> yr(size_t(pr.cap) * H);
  gemm_expert_out(ar.p, ars.p, pr.cap, wq.p, wqs.p, E, H, pr.padded.p, yr, st);
  mxmoe::moe_combine(yr.p, pr.cap, H, pr.row_of.p, w.p, T, k, nullptr,
                     reinterpret_cast<__nv_bfloat16*>(out_ref.p), st);

  // EP.
  Dev<uint8_t> q(size_t(T * H)), qs(size_t(T * H / 32));
  mxmoe::MxOut mx;
  mx.data = q.p;
  mx.scales = qs.p;
  mxmoe::quantize_mxfp8(reinterpret_cast<const __nv_bfloat16*>(x.p), 1, T, H, &mx, nullptr,
                        mxmoe::ScaleMode::kRceil, st);
  ep.dispatch(q.p, qs.p, ids.p, T, st);
  Plan pe(R * maxT, k, El);
  mxmoe::moe_plan(ep.recv_local_ids(), R * maxT, k, El, pe.cap, pe.ws.p, pe.ws.n, pe.view(), st);
  Dev<uint8_t> ae(size_t(pe.cap) * H), aes(size_t(pe.cap) * H / 32);
  ep.gather_recv_mx(pe.row_index.p, pe.cap, pe.padded.p + El, ae.p, aes.p, st);
  Dev<__nv_bfloat16> ye(size_t(pe.cap) * H);
  const size_t w_off = size_t(rank) * El * H * H;
  gemm_expert_out(ae.p, aes.p, pe.cap, wq.p + w_off, wqs.p + w_off / 32, El, H, pe.padded.p, ye, st);
  ep.combine(ye.p, pe.cap, pe.row_of.p, w.p, T, reinterpret_cast<__nv_bfloat16*>(out.p), st);
  ep.check(st);
  const std::vector<uint16_t> got = out.down(size_t(T * H)), want = out_ref.down(size_t(T * H));
  CK(cudaStreamDestroy(st));
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i] && bad++ == 0)
      std::printf("[rank %d] %s: FAIL out[%lld, %lld] = 0x%04x, single-GPU 0x%04x\n", rank, c.name,
                  (long long)(i / H), (long long)(i % H), got[i], want[i]);
  if (bad) std::printf("[rank %d] %s: %lld of %zu outputs differ (seed %u)\n", rank, c.name, (long long)bad,
                       got.size(), seed);
  return bad == 0;
}

// The reference for the dispatch/combine GB/s, measured in the same process: copy-engine copies
// (cudaMemcpyAsync, 256 MB, or the combine region if smaller) from a local buffer into the peer's
// window (EpComm::peer_window), one rank at a time (one-way) and every rank at once (each
// direction of NVLink busy, as during dispatch and combine). Median of 5 after a warm-up; an
// all_gather + stream sync on every rank separates the phases, so no copy overlaps a kernel of
// the case that follows. Returns {one-way GB/s of this rank, GB/s with every rank sending}.
struct P2p {
  double one_way = 0, all_at_once = 0;
};
P2p measure_p2p(mxmoe::EpComm& ep) {
  const int R = ep.world_size(), rank = ep.rank(), peer = (rank + 1) % R;
  const mxmoe::EpWindowLayout& L = ep.layout();
  const size_t bytes = size_t(std::min<int64_t>(L.combine_bytes, int64_t(256) << 20));
  Dev<uint8_t> src(bytes), token(R), gathered(size_t(R) * R);
  char* dst = static_cast<char*>(ep.peer_window(peer)) + L.combine_offset;
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  const auto barrier = [&] {
    ep.all_gather(token.p, gathered.p, size_t(R), st);
    CK(cudaStreamSynchronize(st));
  };
  const auto timed = [&] {
    std::vector<float> t;
    CK(cudaMemcpyAsync(dst, src.p, bytes, cudaMemcpyDeviceToDevice, st));  // warm-up
    for (int i = 0; i < 5; ++i) {
      CK(cudaEventRecord(a, st));
      CK(cudaMemcpyAsync(dst, src.p, bytes, cudaMemcpyDeviceToDevice, st));
      CK(cudaEventRecord(b, st));
      CK(cudaEventSynchronize(b));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, a, b));
      t.push_back(ms);
    }
    return double(bytes) / (median(t) * 1e6);
  };
  P2p p;
  for (int s = 0; s < R; ++s) {
    barrier();
    if (s == rank) p.one_way = timed();
  }
  barrier();
  p.all_at_once = timed();
  barrier();
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  CK(cudaStreamDestroy(st));
  return p;
}

// MXMOE_EP_TIMED_CTAS: comma-separated num_ctas values for the timed case (default: 0, the
// EpConfig default = one per SM); each runs as its own case.
std::vector<int> timed_ctas() {
  std::vector<int> v;
  const char* e = std::getenv("MXMOE_EP_TIMED_CTAS");
  std::string s = e ? e : "";
  for (size_t i = 0; i < s.size();) {
    const size_t j = s.find(',', i);
    const std::string tok = s.substr(i, j == std::string::npos ? std::string::npos : j - i);
    if (!tok.empty()) v.push_back(std::atoi(tok.c_str()));
    if (j == std::string::npos) break;
    i = j + 1;
  }
  if (v.empty()) v.push_back(0);
  return v;
}

}  // namespace

int main() {
  ep_test::World world_env;
  if (!ep_test::world_from_env(world_env)) return 0;
  const int rank = world_env.rank, world = world_env.size;
  const Case all_cases[] = {
      {"uniform H=256 k=4 ragged-T invalid-ids", 256, 4, 8, 333, 17, Route::kUniform, 0.03, 8, false},
      {"all-to-rank0 H=512 k=4", 512, 4, 4, 256, 0, Route::kAllToRank0, 0.0, 16, false},
      {"H=96 k=1 last-rank-empty", 96, 1, 2, 64, -1, Route::kUniform, 0.0, 3, false},
      {"timed H=7168 k=8 E=32/rank T=4096", 7168, 8, 32, 4096, 0, Route::kUniform, 0.0, 0, true},
      {"gemm-expert H=256 k=4 E=4/rank ragged-T", 256, 4, 4, 300, 29, Route::kUniform, 0.02, 8, false, true},
  };
  std::vector<Case> cases;
  for (const Case& c : all_cases) {
    if (!c.timed) {
      cases.push_back(c);
      continue;
    }
    for (int n : timed_ctas()) {
      cases.push_back(c);
      cases.back().num_ctas = n;
    }
  }
  bool all_ok = true;
  P2p p2p;
  bool have_p2p = false;
  try {
    for (const Case& c : cases) {
      mxmoe::EpConfig cfg;
      cfg.hidden = c.hidden;
      cfg.top_k = c.top_k;
      cfg.num_experts = c.experts_per_rank * world;
      cfg.max_tokens = c.max_tokens;
      cfg.num_ctas = c.num_ctas;
      cfg.timeout_s = 20.0;
      std::unique_ptr<mxmoe::EpComm> ep = ep_test::make_comm(world_env, cfg, int(&c - cases.data()));
      if (c.gemm) {
        const bool ok = run_gemm_case(*ep, c, world_env.seed);
        all_ok &= ok;
        std::printf("[rank %d] %s: %s (T = %lld)\n", rank, c.name, ok ? "PASS" : "FAIL",
                    (long long)tokens_of(c, rank, world));
        continue;
      }
      const Outputs o = run_case(*ep, c, world_env.seed, 3);
      const bool ok = check_case(c, o, rank, world, world_env.seed);
      all_ok &= ok;
      std::printf("[rank %d] %s: %s (T = %lld)\n", rank, c.name, ok ? "PASS" : "FAIL",
                  (long long)tokens_of(c, rank, world));
      if (c.timed) {
        // Bytes leaving this rank for other ranks (what NVLink carries), from the host's routing.
        const mxmoe::EpWindowLayout& L = ep->layout();
        const std::vector<int32_t> ids = routing_of(c, rank, world, world_env.seed);
        const int64_t T = tokens_of(c, rank, world);
        double disp = 0, comb = 0;
        for (int64_t t = 0; t < T; ++t) {
          uint64_t mask = 0;
          for (int j = 0; j < c.top_k; ++j) {
            const int id = ids[size_t(t * c.top_k + j)];
            const int owner = id / c.experts_per_rank;
            if (owner != rank) comb += 2.0 * c.hidden;  // one BF16 row comes back per remote slot
            mask |= 1ull << owner;
          }
          mask &= ~(1ull << rank);
          disp += double(__builtin_popcountll(mask)) * double(L.data_bytes + L.scale_bytes);
        }
        disp += double(world - 1) * c.max_tokens * L.ids_bytes;
        if (world == 1) {  // nothing crosses NVLink: report the times only
          std::printf("[rank 0] R = 1: dispatch %.3f ms, combine (+ local sum) %.3f ms (no remote bytes, no GB/s)\n",
                      o.dispatch_ms, o.combine_ms);
        } else {
          if (!have_p2p) {
            p2p = measure_p2p(*ep);
            have_p2p = true;
            std::printf("[rank %d] P2P copy reference (copy engine into the peer's window, 256 MB, median of 5): "
                        "one-way %.1f GB/s, every rank sending at once %.1f GB/s\n",
                        rank, p2p.one_way, p2p.all_at_once);
          }
          const double d1 = disp / (o.dispatch_ms * 1e6), c1 = comb / (o.combine_ms * 1e6);
          const double d2 = disp / (o.dispatch_b2b_ms * 1e6), c2 = comb / (o.combine_b2b_ms * 1e6);
          const double s2 = comb / (o.send_b2b_ms * 1e6);
          std::printf("[rank %d] num_ctas %d: dispatch %.3f ms = %.1f GB/s out of this rank, combine (+ local sum) "
                      "%.3f ms = %.1f GB/s into this rank (single calls, median); back-to-back x%d: dispatch "
                      "%.3f ms = %.1f GB/s (%.0f%% of one-way P2P, %.0f%% of all-at-once), combine %.3f ms = "
                      "%.1f GB/s (%.0f%%, %.0f%%); combine rows alone (combine_send, x%d) %.3f ms = %.1f GB/s "
                      "(%.0f%% of one-way P2P, %.0f%% of all-at-once)\n",
                      rank, ep->config().num_ctas, o.dispatch_ms, d1, o.combine_ms, c1, kBackToBack, o.dispatch_b2b_ms, d2,
                      100 * d2 / p2p.one_way, 100 * d2 / p2p.all_at_once, o.combine_b2b_ms, c2,
                      100 * c2 / p2p.one_way, 100 * c2 / p2p.all_at_once, kBackToBack, o.send_b2b_ms, s2,
                      100 * s2 / p2p.one_way, 100 * s2 / p2p.all_at_once);
        }
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d] ERROR: %s\n", rank, e.what());
    return 2;
  }
  std::printf("[rank %d] %s\n", rank, all_ok ? "ALL PASS" : "SOME FAILED");
  return all_ok ? 0 : 1;
}
