// Shared plumbing of the C ABI (src/host/c_api*.cc): run a C++ call, turn an exception into a
// non-zero status and keep its message for mxmoe_last_error() (thread-local).
#pragma once
#include <exception>
#include <string>

namespace mxmoe::detail {

std::string& c_api_last_error();  // defined in c_api.cc

template <class F>
int c_api_guarded(F&& f) {
  try {
    f();
    c_api_last_error().clear();
    return 0;
  } catch (const std::exception& e) {
    c_api_last_error() = e.what();
  } catch (...) {
    c_api_last_error() = "mxmoe: unknown error";
  }
  return 1;
}

}  // namespace mxmoe::detail
