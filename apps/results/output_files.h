// The files and folders a program will write, checked before any work: one policy for every program (the
// stage executables, compare, kernel_bench, export_safetensors), without LibTorch.
#pragma once

#include <optional>
#include <string>

namespace tt {

// Checks, before any work, a file a program will write: not a folder, its folder creatable and writable (a
// probe file, removed at once), and, without `overwrite`, not there yet. The refusal ("<what> '<path>': why")
// if not; nothing for an empty path.
std::optional<std::string> refuse_output_file(const char* what, const std::string& path, bool overwrite);
// The same for a folder a program will write files into (created later, by the program).
std::optional<std::string> refuse_output_folder(const char* what, const std::string& path);

}  // namespace tt
