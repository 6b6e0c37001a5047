// printf-style formatting into a std::string, for the numbers in progress lines, tables and messages of
// every layer above this one.
#pragma once

#include <cstdio>
#include <string>

namespace tt {

template <class... Args>
std::string strprintf(const char* format, Args... args) {
  const int size = std::snprintf(nullptr, 0, format, args...);
  if (size <= 0) return {};
  std::string out(static_cast<size_t>(size) + 1, '\0');
  std::snprintf(out.data(), out.size(), format, args...);
  out.resize(static_cast<size_t>(size));
  return out;
}

}  // namespace tt
