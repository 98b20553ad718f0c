// EpComm (include/mxmoe/ep.h): NCCL communicator, symmetric window, device communicator, and the
// dispatch/combine launches. Part of the mxmoe_ep library (links NCCL); built only where NCCL is found.
#include <unistd.h>

#include <chrono>
#include <limits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nccl.h>
#include <nccl_device.h>

#include "host/check.h"
#include "kernels/ep/ep_launch.h"
#include "mxmoe/ep.h"
#include "mxmoe/moe_ops.h"

static_assert(sizeof(mxmoe::EpUniqueId) == sizeof(ncclUniqueId), "EpUniqueId must match NCCL_UNIQUE_ID_BYTES");

namespace mxmoe {

namespace {

constexpr const char* kFn = "EpComm";
constexpr size_t kWindowPage = size_t(2) << 20;

void check_nccl(ncclResult_t r, ncclComm_t comm, const char* what) {
  if (r == ncclSuccess || r == ncclInProgress) return;
  std::ostringstream os;
  os << "mxmoe::EpComm: " << what << ": " << ncclGetErrorString(r);
  if (comm != nullptr) {
    const char* last = ncclGetLastError(comm);
    if (last != nullptr && last[0] != '\0') os << " (" << last << ")";
  }
  throw CudaError(os.str());
}
#define MXMOE_NCCL_CHECK(comm, call) check_nccl((call), (comm), #call)

// NVLink multicast must never be used (DESIGN.md §5): force NCCL_NVLS_ENABLE=0 before NCCL reads it.
void disable_nvls() {
  const char* v = std::getenv("NCCL_NVLS_ENABLE");
  if (v == nullptr) {
    setenv("NCCL_NVLS_ENABLE", "0", 0);
  } else if (std::string(v) != "0") {
    detail::throw_arg(kFn, "NCCL_NVLS_ENABLE", v, "must be unset or 0: mxmoe never uses NVLink multicast");
  }
}

EpUniqueId id_from_file(const std::string& path, int rank, double timeout_s) {
  if (path.empty()) detail::throw_arg(kFn, "id_file", "\"\"", "must be a path");
  EpUniqueId id{};
  if (rank == 0) {
    id = EpComm::new_unique_id();
    const std::string tmp = path + ".tmp." + std::to_string(getpid());
    {
      std::ofstream f(tmp, std::ios::binary);
      f.write(id.bytes, sizeof id.bytes);
      if (!f) detail::throw_arg(kFn, "id_file", path, "cannot write " + tmp);
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
      detail::throw_arg(kFn, "id_file", path, "cannot rename " + tmp + " to it");
    return id;
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    std::ifstream f(path, std::ios::binary);
    if (f && f.read(id.bytes, sizeof id.bytes) && f.gcount() == sizeof id.bytes) return id;
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeout_s)
      detail::throw_arg(kFn, "id_file", path,
                        "rank 0 did not write it within cfg.timeout_s = " + detail::to_str(timeout_s) + " s");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// Makes `device` current for a scope (the host-blocking collectives: their NCCL calls go to the
// legacy stream of the current device, which must be the communicator's).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    MXMOE_CUDA_CHECK(kFn, cudaGetDevice(&saved_));
    if (saved_ != device) MXMOE_CUDA_CHECK(kFn, cudaSetDevice(device));
  }
  ~DeviceGuard() { cudaSetDevice(saved_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int saved_ = 0;
};

}  // namespace

struct EpComm::Impl {
  EpConfig cfg;
  EpWindowLayout layout;
  int rank = 0, world = 1, device = 0;
  ncclComm_t comm = nullptr;
  void* window_buf = nullptr;
  ncclWindow_t win = nullptr;
  ncclDevComm dev{};
  bool dev_created = false;
  int* error_flag = nullptr;     // device
  int32_t* home_row = nullptr;   // [max_tokens, k]
  int32_t* local_ids = nullptr;  // [R · max_tokens, k]
  int64_t last_tokens = -1;

  void destroy() noexcept {
    if (comm != nullptr) {
      if (dev_created) ncclDevCommDestroy(comm, &dev);
      if (win != nullptr) ncclCommWindowDeregister(comm, win);
    }
    if (window_buf != nullptr) {
      if (world == 1) cudaFree(window_buf);
      else ncclMemFree(window_buf);
    }
    if (comm != nullptr) ncclCommDestroy(comm);
    cudaFree(error_flag);
    cudaFree(home_row);
    cudaFree(local_ids);
    comm = nullptr;
  }

  detail::EpKernelArgs args(int64_t tokens) const {
    detail::EpKernelArgs a;
    a.win = win;
    if (world == 1) a.local_window = static_cast<char*>(window_buf);
    a.rank = rank;
    a.world = world;
    a.hidden = cfg.hidden;
    a.top_k = cfg.top_k;
    a.num_experts = cfg.num_experts;
    a.local_experts = cfg.num_experts / world;
    a.max_tokens = int(cfg.max_tokens);
    a.tokens = int(tokens);
    a.record_bytes = layout.record_bytes;
    a.scale_bytes = int(layout.scale_bytes);
    a.ids_bytes = int(layout.ids_bytes);
    a.combine_offset = layout.combine_offset;
    a.bf16_offset = layout.bf16_offset;
    a.weights_offset = layout.weights_offset;
    a.timeout_ns = uint64_t(cfg.timeout_s * 1e9);
    a.error_flag = error_flag;
    a.home_row = home_row;
    a.local_ids = local_ids;
    return a;
  }

  // Collective: min and max of each value over the world, and of a local-error flag. Returns the
  // error to throw (empty when every rank is fine and every value agrees); identical on every rank
  // except that the rank with the local error keeps its own message.
  std::string agree(const char* who, const int64_t* values, const char* const* names, int n,
                    const std::string& local_error, cudaStream_t stream) {
    const int m = n + 2;  // values, error flag, rank if in error else R (min: the lowest such rank)
    std::vector<int64_t> mine(static_cast<size_t>(m));
    for (int i = 0; i < n; ++i) mine[size_t(i)] = values[i];
    mine[size_t(n)] = local_error.empty() ? 0 : 1;
    mine[size_t(n + 1)] = local_error.empty() ? int64_t(world) : int64_t(rank);
    DeviceGuard on_device(device);  // a caller may have made another device current (its local error)
    int64_t* d = nullptr;
    MXMOE_CUDA_CHECK(kFn, cudaMalloc(&d, 3 * size_t(m) * sizeof(int64_t)));
    std::vector<int64_t> h(3 * size_t(m));
    try {
      MXMOE_CUDA_CHECK(kFn, cudaMemcpy(d, mine.data(), size_t(m) * sizeof(int64_t), cudaMemcpyHostToDevice));
      MXMOE_NCCL_CHECK(comm, ncclAllReduce(d, d + m, size_t(m), ncclInt64, ncclMin, comm, stream));
      MXMOE_NCCL_CHECK(comm, ncclAllReduce(d, d + 2 * m, size_t(m), ncclInt64, ncclMax, comm, stream));
      MXMOE_CUDA_CHECK(kFn, cudaStreamSynchronize(stream));
      MXMOE_CUDA_CHECK(kFn, cudaMemcpy(h.data(), d, h.size() * sizeof(int64_t), cudaMemcpyDeviceToHost));
    } catch (...) {
      cudaFree(d);
      throw;
    }
    cudaFree(d);
    const int64_t* lo = h.data() + m;
    const int64_t* hi = h.data() + 2 * m;
    if (!local_error.empty()) return local_error;
    if (hi[n] != 0)
      return std::string("mxmoe::") + who + ": rank " + detail::to_str(lo[n + 1]) +
             " rejected its arguments (its own message names the argument); every rank stops here";
    for (int i = 0; i < n; ++i)
      if (lo[i] != hi[i]) {
        std::ostringstream os;
        os << "mxmoe::" << who << ": argument '" << names[i] << "' = " << values[i] << ": differs across ranks (min "
           << lo[i] << ", max " << hi[i] << "): every rank must pass the same value";
        return os.str();
      }
    return {};
  }

  // Every rank must hold the same config: min and max of each field over the world must agree.
  void check_same_config_everywhere(cudaStream_t stream) {
    const int64_t mine[7] = {cfg.hidden, cfg.top_k, cfg.num_experts, cfg.max_tokens, cfg.num_ctas,
                             int64_t(cfg.timeout_s * 1e3), cfg.bf16_rows ? 1 : 0};
    const char* names[7] = {"cfg.hidden", "cfg.top_k", "cfg.num_experts", "cfg.max_tokens", "cfg.num_ctas",
                            "cfg.timeout_s", "cfg.bf16_rows"};
    const std::string err = agree(kFn, mine, names, 7, "", stream);
    if (!err.empty()) throw Error(err);
  }

  void init(const EpConfig& c, int r, int w, const EpUniqueId& id, int dev_index) {
    cfg = c;
    rank = r;
    world = w;
    device = dev_index;
    layout = ep_window_layout(cfg, world);
    int ndev = 0;
    MXMOE_CUDA_CHECK(kFn, cudaGetDeviceCount(&ndev));
    if (device < 0 || device >= ndev)
      detail::throw_arg(kFn, "device", detail::to_str(device),
                        "must be in [0, " + detail::to_str(ndev) + ") (CUDA devices of this process)");
    MXMOE_CUDA_CHECK(kFn, cudaSetDevice(device));
    // The kernels spin on LSA barriers: every CTA must be resident at once (one per SM suffices).
    int sms = 0;
    MXMOE_CUDA_CHECK(kFn, cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    if (cfg.num_ctas == 0) cfg.num_ctas = sms;  // the default: one per SM (config() reports the count)
    if (cfg.num_ctas > sms)
      detail::throw_arg(kFn, "cfg.num_ctas", detail::to_str(cfg.num_ctas),
                        "must be at most the SM count (" + detail::to_str(sms) +
                            "): the barrier CTAs must all be resident");
    ncclUniqueId nid;
    std::memcpy(&nid, id.bytes, sizeof nid);
    MXMOE_NCCL_CHECK(nullptr, ncclCommInitRank(&comm, world, nid, rank));

    const ncclTeam_t lsa = ncclTeamLsa(comm);
    if (lsa.nRanks != world || lsa.rank != rank)
      detail::throw_arg(kFn, "world_size", detail::to_str(world),
                        "every rank must be load/store reachable (one NVLink node): the LSA team has " +
                            detail::to_str(lsa.nRanks) + " ranks, this rank is " + detail::to_str(lsa.rank) +
                            " in it");
    check_same_config_everywhere(nullptr);

    MXMOE_CUDA_CHECK(kFn, cudaMalloc(&error_flag, sizeof(int)));
    MXMOE_CUDA_CHECK(kFn, cudaMemset(error_flag, 0, sizeof(int)));
    MXMOE_CUDA_CHECK(kFn, cudaMalloc(&home_row, size_t(cfg.max_tokens) * cfg.top_k * sizeof(int32_t)));
    MXMOE_CUDA_CHECK(kFn, cudaMalloc(&local_ids, size_t(world) * cfg.max_tokens * cfg.top_k * sizeof(int32_t)));
    MXMOE_CUDA_CHECK(kFn, cudaMemset(local_ids, 0xFF, size_t(world) * cfg.max_tokens * cfg.top_k * sizeof(int32_t)));

    // Allocate and register a whole number of 2 MiB pages (the usual VMM granularity on Hopper),
    // so registration never depends on how NCCL rounds a partial page; identical on every rank.
    const size_t alloc_bytes = (size_t(layout.total_bytes) + kWindowPage - 1) / kWindowPage * kWindowPage;
    if (world == 1) {
      // NCCL gives a one-rank communicator no symmetric memory ("Communicator does not support
      // symmetric memory", run 17): the window is plain device memory and the kernels skip the
      // peer barriers (ep_launch.h).
      MXMOE_CUDA_CHECK(kFn, cudaMalloc(&window_buf, alloc_bytes));
      MXMOE_CUDA_CHECK(kFn, cudaMemset(window_buf, 0, alloc_bytes));
      MXMOE_CUDA_CHECK(kFn, cudaDeviceSynchronize());
      return;
    }
    MXMOE_NCCL_CHECK(comm, ncclMemAlloc(&window_buf, alloc_bytes));
    MXMOE_CUDA_CHECK(kFn, cudaMemset(window_buf, 0, alloc_bytes));
    MXMOE_CUDA_CHECK(kFn, cudaDeviceSynchronize());
    MXMOE_NCCL_CHECK(comm, ncclCommWindowRegister(comm, window_buf, alloc_bytes, &win, NCCL_WIN_COLL_SYMMETRIC));
    ncclDevCommRequirements reqs;
    std::memset(&reqs, 0, sizeof reqs);
    reqs.lsaBarrierCount = cfg.num_ctas;
    MXMOE_NCCL_CHECK(comm, ncclDevCommCreate(comm, &reqs, &dev));
    dev_created = true;
  }
};

EpUniqueId EpComm::new_unique_id() {
  disable_nvls();
  ncclUniqueId nid;
  check_nccl(ncclGetUniqueId(&nid), nullptr, "ncclGetUniqueId");
  EpUniqueId id;
  std::memcpy(id.bytes, &nid, sizeof nid);
  return id;
}

EpComm::EpComm(const EpConfig& cfg, int rank, int world_size, const EpUniqueId& id, int device)
    : impl_(new Impl) {
  try {
    ep_check_config(cfg, rank, world_size);  // before any CUDA/NCCL call
    if (device < 0) detail::throw_arg(kFn, "device", detail::to_str(device), "must be >= 0");
    disable_nvls();
    impl_->init(cfg, rank, world_size, id, device);
  } catch (...) {
    impl_->destroy();
    delete impl_;
    throw;
  }
}

EpComm::EpComm(const EpConfig& cfg, int rank, int world_size, const std::string& id_file, int device)
    : impl_(new Impl) {
  try {
    ep_check_config(cfg, rank, world_size);
    if (device < 0) detail::throw_arg(kFn, "device", detail::to_str(device), "must be >= 0");
    disable_nvls();
    const EpUniqueId id = id_from_file(id_file, rank, cfg.timeout_s);
    impl_->init(cfg, rank, world_size, id, device);
  } catch (...) {
    impl_->destroy();
    delete impl_;
    throw;
  }
}

EpComm::~EpComm() {
  impl_->destroy();
  delete impl_;
}

int EpComm::rank() const { return impl_->rank; }
int EpComm::world_size() const { return impl_->world; }
int EpComm::local_experts() const { return impl_->cfg.num_experts / impl_->world; }
int EpComm::device() const { return impl_->device; }
const EpConfig& EpComm::config() const { return impl_->cfg; }
const EpWindowLayout& EpComm::layout() const { return impl_->layout; }
const int32_t* EpComm::recv_local_ids() const { return impl_->local_ids; }
const uint8_t* EpComm::recv_records() const {
  return static_cast<const uint8_t*>(impl_->window_buf) + impl_->layout.dispatch_offset;
}

void EpComm::dispatch(const uint8_t* x_data, const uint8_t* x_scales, const int32_t* topk_ids, int64_t tokens,
                      cudaStream_t stream) {
  const char* fn = "EpComm::dispatch";
  const EpConfig& c = impl_->cfg;
  if (tokens < 0 || tokens > c.max_tokens)
    detail::throw_arg(fn, "tokens", detail::to_str(tokens), "must be in [0, cfg.max_tokens = " +
                                                                detail::to_str(c.max_tokens) + "]");
  if (tokens > 0) {
    detail::check_not_null(fn, "x_data", x_data);
    detail::check_not_null(fn, "x_scales", x_scales);
    detail::check_not_null(fn, "topk_ids", topk_ids);
    detail::check_aligned(fn, "x_data", x_data, 16);
    detail::check_aligned(fn, "topk_ids", topk_ids, 4);
  }
  detail::check_on_device(fn, impl_->device, stream,
                          {{"x_data", x_data}, {"x_scales", x_scales}, {"topk_ids", topk_ids}});
  detail::launch_ep_dispatch(impl_->dev, impl_->args(tokens), c.num_ctas, x_data, x_scales, topk_ids, stream);
  impl_->last_tokens = tokens;
}

void EpComm::combine_send(const __nv_bfloat16* y, int64_t y_rows, const int32_t* row_of, int64_t tokens,
                          cudaStream_t stream) {
  const char* fn = "EpComm::combine";
  const EpConfig& c = impl_->cfg;
  if (tokens != impl_->last_tokens)
    detail::throw_arg(fn, "tokens", detail::to_str(tokens),
                      "must equal the last dispatch's tokens = " + detail::to_str(impl_->last_tokens));
  if (y_rows < 0 || y_rows > std::numeric_limits<int32_t>::max())
    detail::throw_arg(fn, "y_rows", detail::to_str(y_rows), "must be in [0, 2^31)");
  if (y_rows > 0) {
    detail::check_not_null(fn, "y", y);
    detail::check_aligned(fn, "y", y, 16);
  }
  detail::check_not_null(fn, "row_of", row_of);
  detail::check_aligned(fn, "row_of", row_of, 4);
  detail::check_on_device(fn, impl_->device, stream, {{"y", y}, {"row_of", row_of}});
  detail::launch_ep_combine(impl_->dev, impl_->args(tokens), c.num_ctas, y, y_rows, row_of, stream);
}

void EpComm::combine_targets(const int32_t* row_index, const int32_t* row_of, int64_t rows, const int32_t* rows_used,
                             void** targets, cudaStream_t stream) const {
  const char* fn = "EpComm::combine_targets";
  if (impl_->last_tokens < 0) throw Error("mxmoe::EpComm::combine_targets: no dispatch yet (it reads its routing)");
  if (rows < 0 || rows > std::numeric_limits<int32_t>::max())
    detail::throw_arg(fn, "rows", detail::to_str(rows), "must be in [0, 2^31)");
  if (rows > 0) {
    detail::check_not_null(fn, "row_index", row_index);
    detail::check_not_null(fn, "targets", targets);
    detail::check_aligned(fn, "row_index", row_index, 4);
    detail::check_aligned(fn, "targets", targets, 8);
  }
  detail::check_not_null(fn, "row_of", row_of);
  detail::check_aligned(fn, "row_of", row_of, 4);
  if (rows_used != nullptr) detail::check_aligned(fn, "rows_used", rows_used, 4);
  detail::check_on_device(fn, impl_->device, stream,
                          {{"row_index", row_index}, {"row_of", row_of}, {"rows_used", rows_used}, {"targets", targets}});
  detail::launch_ep_combine_targets(impl_->args(impl_->last_tokens), row_index, row_of, rows, rows_used, targets,
                                    stream);
}

void EpComm::combine_commit(int64_t tokens, cudaStream_t stream) {
  const char* fn = "EpComm::combine_commit";
  if (tokens != impl_->last_tokens)
    detail::throw_arg(fn, "tokens", detail::to_str(tokens),
                      "must equal the last dispatch's tokens = " + detail::to_str(impl_->last_tokens));
  detail::check_on_device(fn, impl_->device, stream, {});
  detail::launch_ep_combine_barrier(impl_->dev, impl_->args(tokens), impl_->cfg.num_ctas, stream);
}

void* EpComm::peer_window(int peer) const {
  const char* fn = "EpComm::peer_window";
  if (peer < 0 || peer >= impl_->world)
    detail::throw_arg(fn, "peer", detail::to_str(peer), "must be in [0, " + detail::to_str(impl_->world) + ")");
  detail::check_on_device(fn, impl_->device, nullptr, {});
  void** d = nullptr;
  MXMOE_CUDA_CHECK(fn, cudaMalloc(&d, sizeof(void*)));
  void* h = nullptr;
  detail::launch_ep_peer_window(impl_->args(impl_->last_tokens), peer, d, nullptr);
  const cudaError_t e = cudaMemcpy(&h, d, sizeof(void*), cudaMemcpyDeviceToHost);
  cudaFree(d);
  MXMOE_CUDA_CHECK(fn, e);
  return h;
}

const __nv_bfloat16* EpComm::combine_rows() const {
  return reinterpret_cast<const __nv_bfloat16*>(static_cast<const char*>(impl_->window_buf) +
                                                impl_->layout.combine_offset);
}
const int32_t* EpComm::home_rows() const { return impl_->home_row; }

void EpComm::combine(const __nv_bfloat16* y, int64_t y_rows, const int32_t* row_of, const float* topk_weights,
                     int64_t tokens, __nv_bfloat16* out, cudaStream_t stream) {
  const char* fn = "EpComm::combine";
  if (tokens > 0) {
    detail::check_not_null(fn, "topk_weights", topk_weights);
    detail::check_not_null(fn, "out", out);
    detail::check_aligned(fn, "out", out, 16);
  }
  detail::check_on_device(fn, impl_->device, stream, {{"topk_weights", topk_weights}, {"out", out}});
  combine_send(y, y_rows, row_of, tokens, stream);
  const EpConfig& c = impl_->cfg;
  if (tokens > 0)
    moe_combine(combine_rows(), c.max_tokens * c.top_k, c.hidden, impl_->home_row, topk_weights, tokens, c.top_k,
                nullptr, out, stream);
}

void EpComm::dispatch_bf16(const __nv_bfloat16* x, const int32_t* topk_ids, const float* topk_weights, int64_t tokens,
                           cudaStream_t stream) {
  const char* fn = "EpComm::dispatch_bf16";
  const EpConfig& c = impl_->cfg;
  if (!c.bf16_rows)
    detail::throw_arg(fn, "cfg.bf16_rows", "false", "must be true (the window has no BF16 row region)");
  if (tokens < 0 || tokens > c.max_tokens)
    detail::throw_arg(fn, "tokens", detail::to_str(tokens), "must be in [0, cfg.max_tokens = " +
                                                                detail::to_str(c.max_tokens) + "]");
  if (tokens > 0) {
    detail::check_not_null(fn, "x", x);
    detail::check_aligned(fn, "x", x, 16);
    detail::check_not_null(fn, "topk_ids", topk_ids);
    detail::check_aligned(fn, "topk_ids", topk_ids, 4);
    detail::check_aligned(fn, "topk_weights", topk_weights, 4);
  }
  detail::check_on_device(fn, impl_->device, stream,
                          {{"x", x}, {"topk_ids", topk_ids}, {"topk_weights", topk_weights}});
  detail::launch_ep_dispatch_bf16(impl_->dev, impl_->args(tokens), c.num_ctas, x, topk_weights, topk_ids, stream);
  impl_->last_tokens = tokens;
}

const __nv_bfloat16* EpComm::recv_bf16_rows() const {
  if (!impl_->cfg.bf16_rows) return nullptr;
  return reinterpret_cast<const __nv_bfloat16*>(static_cast<const char*>(impl_->window_buf) +
                                                impl_->layout.bf16_offset);
}
const float* EpComm::recv_weights() const {
  if (!impl_->cfg.bf16_rows) return nullptr;
  return reinterpret_cast<const float*>(static_cast<const char*>(impl_->window_buf) + impl_->layout.weights_offset);
}

void EpComm::all_gather(const void* send, void* recv, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return;
  detail::check_not_null("EpComm::all_gather", "send", send);
  detail::check_not_null("EpComm::all_gather", "recv", recv);
  detail::check_on_device("EpComm::all_gather", impl_->device, stream, {{"send", send}, {"recv", recv}});
  MXMOE_NCCL_CHECK(impl_->comm, ncclAllGather(send, recv, bytes, ncclUint8, impl_->comm, stream));
}

void EpComm::agree(const char* who, const int64_t* values, const char* const* names, int n,
                   const std::string& local_error) {
  const std::string err = impl_->agree(who, values, names, n, local_error, nullptr);
  if (!err.empty()) throw Error(err);
}

void EpComm::gather_recv_mx(const int32_t* row_index, int64_t out_rows, const int32_t* rows_used, uint8_t* data,
                            uint8_t* scales, cudaStream_t stream) const {
  const char* fn = "EpComm::gather_recv_mx";
  if (out_rows < 0 || out_rows % 128 != 0)
    detail::throw_arg(fn, "out_rows", detail::to_str(out_rows), "must be a non-negative multiple of 128");
  if (out_rows > 0) {
    detail::check_not_null(fn, "row_index", row_index);
    detail::check_aligned(fn, "row_index", row_index, 4);
    detail::check_not_null(fn, "data", data);
    detail::check_aligned(fn, "data", data, 16);
    detail::check_not_null(fn, "scales", scales);
  }
  if (rows_used != nullptr) detail::check_aligned(fn, "rows_used", rows_used, 4);
  detail::check_on_device(fn, impl_->device, stream,
                          {{"row_index", row_index}, {"rows_used", rows_used}, {"data", data}, {"scales", scales}});
  const EpConfig& c = impl_->cfg;
  detail::launch_ep_gather_recv_mx(recv_records(), impl_->layout.record_bytes, int64_t(impl_->world) * c.max_tokens,
                                   c.hidden, row_index, out_rows, rows_used, data, scales, stream);
}

void EpComm::check(cudaStream_t stream) {
  MXMOE_CUDA_CHECK("EpComm::check", cudaStreamSynchronize(stream));
  int flag = 0;
  MXMOE_CUDA_CHECK("EpComm::check", cudaMemcpy(&flag, impl_->error_flag, sizeof flag, cudaMemcpyDeviceToHost));
  if (flag != 0) {
    std::ostringstream os;
    os << "mxmoe::EpComm::check: rank " << impl_->rank << ": a device barrier timed out after "
       << impl_->cfg.timeout_s << " s (flags 0x" << std::hex << flag << std::dec << ":";
    if (flag & detail::kEpErrDispatchEntry) os << " dispatch-entry";
    if (flag & detail::kEpErrDispatchExit) os << " dispatch-exit";
    if (flag & detail::kEpErrCombineEntry) os << " combine-entry";
    if (flag & detail::kEpErrCombineExit) os << " combine-exit";
    os << "): a peer did not arrive (crashed, or ranks called different sequences); destroy this EpComm";
    throw CudaError(os.str());
  }
  ncclResult_t async = ncclSuccess;
  check_nccl(ncclCommGetAsyncError(impl_->comm, &async), impl_->comm, "ncclCommGetAsyncError");
  check_nccl(async, impl_->comm, "asynchronous NCCL error");
}

}  // namespace mxmoe
