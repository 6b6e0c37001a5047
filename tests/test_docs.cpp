// Keeps README.md and docs/*.md from going stale: every relative link resolves (file and heading), every
// scripts/*.sh they name exists, and every --flag they name is one of our executables' options (from their
// own --help), one of our scripts' options (their `case` patterns), or a listed third-party tool's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "apps/cli/command_line.h"
#include "apps/cli/compare_cli.h"
#include "apps/cli/generate_cli.h"
#include "apps/cli/kernel_bench_cli.h"
#include "apps/cli/roofline_cli.h"
#include "apps/cli/stage_cli.h"

namespace tt {
namespace {

namespace fs = std::filesystem;

const fs::path kRoot = TT_SOURCE_DIR;

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<fs::path> doc_files() {
  std::vector<fs::path> files = {kRoot / "README.md"};
  for (const auto& entry : fs::directory_iterator(kRoot / "docs"))
    if (entry.path().extension() == ".md") files.push_back(entry.path());
  std::sort(files.begin() + 1, files.end());
  return files;
}

// The text outside ``` fences: links inside code are not links.
std::string outside_code(const std::string& text) {
  std::string out, line;
  std::istringstream in(text);
  bool fence = false;
  while (std::getline(in, line)) {
    if (line.rfind("```", 0) == 0) {
      fence = !fence;
      continue;
    }
    if (!fence) out += line + "\n";
  }
  return out;
}

// GitHub's anchor for a heading: lower case, punctuation dropped (hyphens and underscores kept), spaces to
// hyphens.
std::string slug(const std::string& heading) {
  std::string out;
  for (unsigned char c : heading) {
    if (std::isalnum(c) || c == '-' || c == '_' || c >= 0x80)
      out += static_cast<char>(std::tolower(c));
    else if (c == ' ')
      out += '-';
  }
  return out;
}

std::set<std::string> anchors_of(const fs::path& file) {
  std::set<std::string> anchors;
  std::istringstream in(outside_code(read_text(file)));
  for (std::string line; std::getline(in, line);) {
    const size_t hashes = line.find_first_not_of('#');
    if (hashes == 0 || hashes == std::string::npos || hashes > 6 || line[hashes] != ' ') continue;
    anchors.insert(slug(line.substr(hashes + 1)));
  }
  return anchors;
}

TEST(Docs, EveryPageIsThere) {
  for (const char* page : {"stages.md", "running.md", "debugging.md", "roofline-energy.md", "evaluation.md",
                           "multi-gpu.md", "results.md", "tests.md", "amd.md"})
    EXPECT_TRUE(fs::exists(kRoot / "docs" / page)) << page;
  // The front page stays one: at most about 250 lines.
  const std::string readme = read_text(kRoot / "README.md");
  EXPECT_LE(std::count(readme.begin(), readme.end(), '\n'), 250);
}

TEST(Docs, EveryRelativeLinkResolvesToAFileAndHeading) {
  const std::regex link(R"(\[[^\]]*\]\(([^)\s]+)\))");
  size_t checked = 0;
  for (const auto& file : doc_files()) {
    const std::string text = outside_code(read_text(file));
    for (auto it = std::sregex_iterator(text.begin(), text.end(), link); it != std::sregex_iterator(); ++it) {
      const std::string target = (*it)[1];
      if (target.rfind("http://", 0) == 0 || target.rfind("https://", 0) == 0 || target.rfind("mailto:", 0) == 0)
        continue;
      const size_t hash = target.find('#');
      const std::string path_part = target.substr(0, hash);
      const fs::path resolved = path_part.empty() ? file : file.parent_path() / path_part;
      ++checked;
      if (!fs::exists(resolved)) {
        ADD_FAILURE() << file.filename() << ": link to '" << target << "': no file " << resolved;
        continue;
      }
      if (hash == std::string::npos || resolved.extension() != ".md") continue;
      const std::string anchor = target.substr(hash + 1);
      EXPECT_TRUE(anchors_of(resolved).count(anchor))
          << file.filename() << ": link to '" << target << "': " << resolved.filename() << " has no heading '#"
          << anchor << "'";
    }
  }
  EXPECT_GT(checked, 20u) << "the README links every docs page";
}

TEST(Docs, EveryScriptNamedExists) {
  const std::regex script(R"(scripts/[A-Za-z0-9_*.-]+\.sh)");
  std::set<std::string> named;
  for (const auto& file : doc_files()) {
    const std::string text = read_text(file);
    for (auto it = std::sregex_iterator(text.begin(), text.end(), script); it != std::sregex_iterator(); ++it)
      named.insert(it->str());
  }
  EXPECT_TRUE(named.count("scripts/debugging_stages.sh"));
  for (const auto& name : named) {
    if (name.find('*') == std::string::npos) {
      EXPECT_TRUE(fs::exists(kRoot / name)) << name << " is named in the docs but does not exist";
      continue;
    }
    // A pattern (scripts/profile_*.sh): at least one script matches it.
    const std::string prefix = name.substr(8, name.find('*') - 8);
    bool any = false;
    for (const auto& entry : fs::directory_iterator(kRoot / "scripts"))
      any = any || entry.path().filename().string().rfind(prefix, 0) == 0;
    EXPECT_TRUE(any) << name << " matches no script";
  }
}

void add_flags(const std::string& text, std::set<std::string>& flags) {
  const std::regex flag(R"((^|[^A-Za-z0-9_-])(--[a-z][a-z0-9-]*))");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), flag); it != std::sregex_iterator(); ++it)
    flags.insert((*it)[2]);
}

std::string help_of(int (*main)(const std::vector<std::string>&, std::ostream&, std::ostream&)) {
  std::ostringstream out, err;
  EXPECT_EQ(main({"--help"}, out, err), 0) << err.str();
  return out.str();
}

TEST(Docs, EveryFlagNamedIsAnOptionOfOursOrAListedTools) {
  std::set<std::string> known;
  // Our executables, from their own option definitions (--help lists every one).
  add_flags(parse_command_line("v3_custom", {"--help"}).help_text, known);
  for (auto main : {compare_main, generate_main, kernel_bench_main, roofline_main}) add_flags(help_of(main), known);
  // Our scripts: the patterns of their option `case` branches ("--config) ...", "--no-build | --x=*) ...").
  const std::regex branch(R"((^|\n)[ \t]*((--[a-z][a-z0-9-]*(=\*)?[ \t]*\|[ \t]*)*--[a-z][a-z0-9-]*(=\*)?)\))");
  for (const auto& entry : fs::directory_iterator(kRoot / "scripts")) {
    if (entry.path().extension() != ".sh") continue;
    const std::string text = read_text(entry.path());
    for (auto it = std::sregex_iterator(text.begin(), text.end(), branch); it != std::sregex_iterator(); ++it)
      add_flags((*it)[2], known);
  }
  ASSERT_TRUE(known.count("--profile-steps") && known.count("--fail-if-slower") && known.count("--repeats"))
      << "the option sources were read";
  // Third-party tools' flags the docs quote, by tool.
  const std::map<std::string, std::vector<std::string>> tools = {
      {"ncu", {"--metrics", "--import", "--csv", "--page", "--print-units", "--query-metrics", "--set"}},
      {"nsys, rocprof-sys-sample", {"--trace", "--host"}},
      {"rocprofv3", {"--runtime-trace", "--kernel-trace", "--stats"}},
      {"rocprof-compute", {"--roof-only", "--path", "--name"}},
      {"srun, sbatch", {"--nodes", "--ntasks-per-node", "--gpus-per-node", "--signal"}},
      {"pip", {"--index-url"}},
      {"compute-sanitizer", {"--kernel-name"}},
  };
  for (const auto& [tool, flags] : tools) known.insert(flags.begin(), flags.end());
  for (const auto& file : doc_files()) {
    std::set<std::string> named;
    add_flags(read_text(file), named);
    for (const auto& f : named)
      EXPECT_TRUE(known.count(f)) << file.filename() << " names " << f
                                  << ", which no executable, script or listed tool of the docs has";
  }
}

}  // namespace
}  // namespace tt
