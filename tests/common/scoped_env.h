// ScopedEnv: sets an environment variable for one scope and puts back what was there (the old value,
// or unset). The library reads its MXMOE_* switches on every call, so tests flip them per scope;
// restoring (not just unsetting) keeps an outer scope's setting alive after a nested one ends.
#pragma once
#include <cstdlib>
#include <string>

namespace mxmoe::test {

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* v = std::getenv(name);
    had_ = v != nullptr;
    if (had_) old_ = v;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_) setenv(name_, old_.c_str(), 1);
    else unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

}  // namespace mxmoe::test
