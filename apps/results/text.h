// printf-style formatting into a std::string, for the numbers in progress lines, tables and messages of
// every layer above this one; and escaping for the SVG and HTML the reports write.
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

// Text placed inside SVG or HTML (kernel names hold '<' and '&'): the characters markup gives a meaning.
inline std::string xml_escape(const std::string& s) {
  std::string out;
  for (char ch : s) {
    switch (ch) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += ch;
    }
  }
  return out;
}

}  // namespace tt
