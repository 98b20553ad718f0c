// mxmoe errors. Every public entry point validates its arguments on the host before any launch
// and throws mxmoe::Error whose message names the function and the offending argument, e.g.
//   mxmoe::quantize_mxfp8: argument 'cols' = 100: must be a multiple of 32
// CUDA failures (launch or runtime) throw mxmoe::CudaError with the CUDA error string.
#pragma once
#include <stdexcept>
#include <string>

namespace mxmoe {

class Error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

class CudaError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace mxmoe
