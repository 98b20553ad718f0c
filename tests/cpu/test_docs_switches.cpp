// docs/switches.md lists every environment variable the library reads: each string literal
// "MXMOE_..." passed to getenv, env_choice, env_int or a *_env helper anywhere under src/ must appear in it as a
// whole name (not followed by another name character).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

namespace {

std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

}  // namespace

TEST(DocsSwitches, EveryVariableIsListed) {
  const std::filesystem::path root(MXMOE_SOURCE_DIR);
  const std::string doc = read_file(root / "docs" / "switches.md");
  ASSERT_FALSE(doc.empty()) << "docs/switches.md is missing or empty";
  // The variable as a literal argument of a reader (the DOWN_ switches are named through a prefix).
  const std::regex reader(R"((getenv|env_choice|env_int|[a-z_]+_env)\((fn, |"[a-z_]+", )?"(MXMOE_[A-Z0-9_]+)\")");
  std::set<std::string> names;
  for (const auto& e : std::filesystem::recursive_directory_iterator(root / "src")) {
    if (!e.is_regular_file()) continue;
    const std::string text = read_file(e.path());
    for (std::sregex_iterator it(text.begin(), text.end(), reader), end; it != end; ++it) names.insert((*it)[3]);
  }
  EXPECT_GE(names.size(), 20u) << "the scan found too few variables: the pattern no longer matches the code";
  const auto name_char = [](char c) { return (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'; };
  for (const std::string& n : names) {
    bool listed = false;
    for (size_t at = doc.find(n); at != std::string::npos && !listed; at = doc.find(n, at + 1))
      listed = at + n.size() >= doc.size() || !name_char(doc[at + n.size()]);
    EXPECT_TRUE(listed) << n << " is read in src/ but not listed in docs/switches.md";
  }
}
