#include "models/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "models/atomic_file.h"

namespace tt {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors files are little-endian");

// The library refuses larger headers (a guard against reading a huge length from a damaged file).
constexpr uint64_t kMaxHeaderBytes = 100 * 1000 * 1000;

const std::vector<std::pair<torch::ScalarType, std::string>>& dtype_names() {
  static const std::vector<std::pair<torch::ScalarType, std::string>> names = {
      {torch::kFloat, "F32"}, {torch::kHalf, "F16"}, {torch::kBFloat16, "BF16"}, {torch::kDouble, "F64"},
      {torch::kChar, "I8"},   {torch::kShort, "I16"}, {torch::kInt, "I32"},      {torch::kLong, "I64"},
      {torch::kByte, "U8"},   {torch::kBool, "BOOL"}};
  return names;
}

std::string dtype_name(torch::ScalarType type) {
  for (const auto& [t, name] : dtype_names())
    if (t == type) return name;
  TORCH_CHECK(false, "safetensors: dtype ", type, " has no safetensors name");
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata, bool overwrite) {
  TORCH_CHECK(overwrite || !std::filesystem::exists(path), "safetensors file '", path,
              "' exists; pass --overwrite to replace it or choose another path");
  std::vector<torch::Tensor> data;
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    TORCH_CHECK(name != "__metadata__" && !header.contains(name), "safetensors: tensor name '", name,
                "' is reserved or repeated");
    data.push_back(tensor.detach().to(torch::kCPU).contiguous());
    const uint64_t bytes = data.back().nbytes();
    header[name] = {{"dtype", dtype_name(tensor.scalar_type())},
                    {"shape", tensor.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  // Padded with spaces so that the data starts 8-byte aligned, as the safetensors library writes it.
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t length = text.size();

  AtomicFile file(path, "safetensors file");
  unsigned char prefix[8];
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<unsigned char>(length >> (8 * i));
  file.write(prefix, sizeof(prefix));
  file.write(text.data(), text.size());
  for (const auto& t : data) file.write(t.data_ptr(), t.nbytes());
  file.commit();
}

SafetensorsFile read_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK(in.good(), "cannot open safetensors file '", path, "'");
  const std::string file = "safetensors file '" + path + "'";
  const uint64_t file_size = std::filesystem::file_size(path);
  TORCH_CHECK(file_size >= 8, file, " is shorter than its 8-byte header length");
  unsigned char prefix[8];
  in.read(reinterpret_cast<char*>(prefix), 8);
  uint64_t length = 0;
  for (int i = 0; i < 8; ++i) length |= static_cast<uint64_t>(prefix[i]) << (8 * i);
  TORCH_CHECK(length <= kMaxHeaderBytes && length <= file_size - 8, file, ": header length ", length,
              " is past the end of the file (", file_size, " bytes) or over ", kMaxHeaderBytes);
  std::string text(length, '\0');
  in.read(text.data(), static_cast<std::streamsize>(length));
  TORCH_CHECK(in.good(), file, ": cannot read its header");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    TORCH_CHECK(false, file, ": its header is not JSON: ", e.what());
  }
  TORCH_CHECK(header.is_object(), file, ": its header is not a JSON object");

  SafetensorsFile out;
  struct Entry {
    std::string name;
    torch::ScalarType dtype;
    std::vector<int64_t> shape;
    uint64_t begin, end;
  };
  std::vector<Entry> entries;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      TORCH_CHECK(value.is_object(), file, ": __metadata__ must be an object of strings");
      for (const auto& [key, text_value] : value.items()) {
        TORCH_CHECK(text_value.is_string(), file, ": __metadata__.", key, " must be a string");
        out.metadata[key] = text_value.get<std::string>();
      }
      continue;
    }
    const std::string where = file + ": tensor '" + name + "'";
    TORCH_CHECK(value.is_object() && value.contains("dtype") && value.contains("shape") &&
                    value.contains("data_offsets"),
                where, " needs dtype, shape and data_offsets");
    const auto& dtype = value.at("dtype");
    TORCH_CHECK(dtype.is_string(), where, ": dtype must be a string");
    Entry e{name, torch::kFloat, {}, 0, 0};
    bool known = false;
    for (const auto& [t, n] : dtype_names())
      if (n == dtype.get<std::string>()) e.dtype = t, known = true;
    TORCH_CHECK(known, where, ": dtype \"", dtype.get<std::string>(), "\" is not one this reader takes");
    const auto& shape = value.at("shape");
    TORCH_CHECK(shape.is_array(), where, ": shape must be an array");
    uint64_t numel = 1;
    for (const auto& d : shape) {
      TORCH_CHECK(d.is_number_unsigned(), where, ": shape must hold non-negative integers");
      e.shape.push_back(d.get<int64_t>());
      numel *= d.get<uint64_t>();
    }
    const auto& offsets = value.at("data_offsets");
    TORCH_CHECK(offsets.is_array() && offsets.size() == 2 && offsets[0].is_number_unsigned() &&
                    offsets[1].is_number_unsigned(),
                where, ": data_offsets must be [begin, end]");
    e.begin = offsets[0].get<uint64_t>();
    e.end = offsets[1].get<uint64_t>();
    const uint64_t bytes = numel * c10::elementSize(e.dtype);
    TORCH_CHECK(e.begin <= e.end && e.end - e.begin == bytes, where, ": data_offsets [", e.begin, ", ", e.end,
                ") hold ", e.end - e.begin, " bytes, its shape and dtype need ", bytes);
    entries.push_back(std::move(e));
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  const uint64_t data_size = file_size - 8 - length;
  uint64_t expected = 0;
  for (const auto& e : entries) {
    TORCH_CHECK(e.begin == expected, file, ": tensor '", e.name, "' starts at ", e.begin, ", the data before it ends at ",
                expected, " (tensors must follow each other without gaps or overlap)");
    expected = e.end;
  }
  TORCH_CHECK(expected == data_size, file, ": its tensors hold ", expected, " bytes, the file has ", data_size,
              " after the header");
  for (const auto& e : entries) {
    torch::Tensor t = torch::empty(e.shape, torch::TensorOptions().dtype(e.dtype));
    in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
    TORCH_CHECK(in.good() || t.nbytes() == 0, file, ": cannot read tensor '", e.name, "'");
    out.tensors.emplace_back(e.name, std::move(t));
  }
  return out;
}

}  // namespace tt
