// The safetensors format (https://huggingface.co/docs/safetensors): an 8-byte little-endian header length,
// a JSON header mapping each tensor's name to {"dtype", "shape", "data_offsets": [begin, end)} (offsets into
// the data after the header) plus an optional "__metadata__" of strings, then the tensors' bytes, row-major,
// back to back. Written by our own code (it is that simple); read back strictly, so tests and tools can
// check a file as the safetensors library would.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

namespace tt {

// Writes the tensors in the given order, atomically (models/atomic_file.h). Dtypes: fp32, fp16, bf16,
// fp64, int8/16/32/64, uint8, bool. An existing file is replaced only with `overwrite`.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata, bool overwrite);

struct SafetensorsFile {
  std::vector<std::pair<std::string, torch::Tensor>> tensors;  // in the order of their data
  std::map<std::string, std::string> metadata;
};

// Throws naming the file and what is wrong: a header length past the file, JSON that does not parse, an
// unknown dtype, offsets that do not match the shape's bytes, overlap, gaps, or bytes past the last tensor.
SafetensorsFile read_safetensors(const std::string& path);

}  // namespace tt
