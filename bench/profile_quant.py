"""Launches each quantizer variant once on 16384x7168 (BF16) so that a profiler can look at it:
  ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \\
      --section WarpStateStats -k regex:quantize_mxfp8 python3 bench/profile_quant.py
Order: rowwise, colwise, row+col, row+col+fast."""
import torch

from common import check, load_lib, ptr, require_gpu

require_gpu()
lib = load_lib()
R, C = 16384, 7168
x = torch.randn(R, C, device="cuda").to(torch.bfloat16)
u8 = dict(dtype=torch.uint8, device="cuda")
rd, rs, rfd, rfs = torch.empty(R, C, **u8), torch.empty(R, C // 32, **u8), torch.empty(R, C, **u8), torch.empty(C // 128, R, **u8)
cd, cs, cfd, cfs = torch.empty(C, R, **u8), torch.empty(C, R // 32, **u8), torch.empty(C, R, **u8), torch.empty(R // 128, C, **u8)
N = None
for args in ([rd, rs, N, N, N, N, N, N], [N, N, N, N, cd, cs, N, N], [rd, rs, N, N, cd, cs, N, N],
             [rd, rs, rfd, rfs, cd, cs, cfd, cfs]):
    check(lib, lib.mxmoe_quantize_mxfp8(ptr(x), 1, R, C, *[ptr(a) for a in args], 0, None))
torch.cuda.synchronize()
print("done")
