// Helpers for the argument-check tests (CPU only: the checks run before any CUDA call, so fake
// device pointers are never dereferenced).
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>

#include "mxmoe/error.h"

namespace mxmoe::test {

// A fake device pointer with a chosen address (for alignment and null checks).
template <class T = uint8_t>
T* fake(uintptr_t addr) {
  return reinterpret_cast<T*>(addr);
}

// f must throw mxmoe::Error whose message names 'arg' (quoted).
inline void expect_error_naming(const std::function<void()>& f, const std::string& arg) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one naming '" << arg << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'" + arg + "'"), std::string::npos) << e.what();
  }
}

}  // namespace mxmoe::test
