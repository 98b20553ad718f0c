// Arch guard shared by the instruction wrappers in src/device/. Each wrapper compiles its PTX only
// for sm_90a (wgmma, setmaxnreg and the TMA tensor copies need the arch-specific target) and traps
// loudly anywhere else, so a wrong -gencode never runs silently.
#pragma once
#include <cstdio>  // printf in MXMOE_DEVICE_UNSUPPORTED

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MXMOE_SM90A_ENABLED 1
#endif

#define MXMOE_DEVICE_UNSUPPORTED()                                                         \
  do {                                                                                     \
    printf("mxmoe: %s needs sm_90a (build with -gencode=arch=compute_90a,code=sm_90a)\n",  \
           __func__);                                                                      \
    __trap();                                                                              \
  } while (0)
