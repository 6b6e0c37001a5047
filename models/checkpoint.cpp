#include "models/checkpoint.h"

#include <array>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>
#include <sstream>
#include <unordered_map>

#include <ATen/Parallel.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/csrc/jit/serialization/unpickler.h>

#include "models/atomic_file.h"

namespace tt {
namespace {

const std::string kExpAvg = "optimizer.exp_avg.";
const std::string kExpAvgSq = "optimizer.exp_avg_sq.";
constexpr const char* kChecksumAlgorithm = "crc32";
// A record beside data.pkl with its CRC-32 (decimal): checked before the unpickler sees data.pkl, whose
// parser is not built for damaged input. torch.load ignores records it does not know.
constexpr const char* kPickleChecksumRecord = "tinytransformer/data.pkl.crc32";

// ---- CRC-32 (zlib's: polynomial 0xEDB88320), eight bytes per step ------------------------------------
// Python's zlib.crc32 gives the same numbers, so a checkpoint can be checked without this code.

using CrcTables = std::array<std::array<uint32_t, 256>, 8>;

const CrcTables& crc_tables() {
  static const CrcTables tables = [] {
    CrcTables t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i)
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
    return t;
  }();
  return tables;
}

class Crc32 {
 public:
  Crc32& update(const void* data, size_t n) {
    const auto& t = crc_tables();
    const auto* p = static_cast<const unsigned char*>(data);
    uint32_t c = state_;
    for (; n >= 8; n -= 8, p += 8) {
      uint32_t lo, hi;
      std::memcpy(&lo, p, 4);
      std::memcpy(&hi, p + 4, 4);
      lo ^= c;
      c = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^ t[3][hi & 0xFF] ^
          t[2][(hi >> 8) & 0xFF] ^ t[1][(hi >> 16) & 0xFF] ^ t[0][hi >> 24];
    }
    for (; n > 0; --n, ++p) c = t[0][(c ^ *p) & 0xFF] ^ (c >> 8);
    state_ = c;
    return *this;
  }
  Crc32& update(const std::string& text) { return update(text.data(), text.size()); }
  int64_t value() const { return static_cast<int64_t>(~state_ & 0xFFFFFFFFu); }

 private:
  uint32_t state_ = 0xFFFFFFFFu;
};

// The dtype as Python prints it after "torch." (float32, bfloat16, uint8), so that docs/training.md's
// recipe recomputes a checksum from torch.load's tensors.
std::string dtype_name(torch::ScalarType type) {
  switch (type) {
    case torch::kFloat: return "float32";
    case torch::kDouble: return "float64";
    case torch::kHalf: return "float16";
    case torch::kBFloat16: return "bfloat16";
    case torch::kByte: return "uint8";
    case torch::kChar: return "int8";
    case torch::kShort: return "int16";
    case torch::kInt: return "int32";
    case torch::kLong: return "int64";
    case torch::kBool: return "bool";
    default: return c10::toString(type);
  }
}

std::string shape_text(c10::IntArrayRef sizes) {
  std::string out = "[";
  for (size_t i = 0; i < sizes.size(); ++i) out += (i ? ", " : "") + std::to_string(sizes[i]);
  return out + "]";
}

// CRC-32 of "<key>\n<dtype>\n<shape>\n" followed by the tensor's bytes (row-major): a flipped dtype or
// shape in data.pkl fails the check as a flipped byte of the data does.
int64_t tensor_checksum(const std::string& key, const torch::Tensor& t) {
  Crc32 crc;
  crc.update(key + "\n" + dtype_name(t.scalar_type()) + "\n" + shape_text(t.sizes()) + "\n");
  const torch::Tensor bytes = t.contiguous();
  return crc.update(bytes.data_ptr(), bytes.nbytes()).value();
}

// The checksums of many tensors, in parallel: reading a 12 GB checkpoint should be bound by the disk.
std::vector<int64_t> tensor_checksums(const std::vector<std::pair<std::string, torch::Tensor>>& tensors) {
  std::vector<int64_t> out(tensors.size());
  at::parallel_for(0, static_cast<int64_t>(tensors.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out[i] = tensor_checksum(tensors[i].first, tensors[i].second);
  });
  return out;
}

// The scalar fields (every entry that is not a tensor and not the checksums): "<key>\n<i|s>\n<value>\n" in
// key order.
int64_t fields_checksum(const std::map<std::string, c10::IValue>& fields) {
  Crc32 crc;
  for (const auto& [key, value] : fields)
    crc.update(key + "\n" + (value.isInt() ? "i\n" + std::to_string(value.toInt()) : "s\n" + value.toStringRef()) +
               "\n");
  return crc.value();
}

// ---- Writing -----------------------------------------------------------------------------------

// Records hold the tensors' bytes as this machine stores them; the archive's byteorder record says "little".
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "checkpoints are written little-endian");

// A tensor whose storage holds exactly its bytes, so that the file's record is the tensor.
torch::Tensor compact(const torch::Tensor& t) {
  torch::Tensor c = t.detach().to(torch::kCPU);
  if (!c.is_contiguous() || c.storage_offset() != 0 || c.storage().nbytes() != c.nbytes()) c = c.contiguous().clone();
  return c;
}

// The archive torch.save writes (data.pkl, .format_version, .storage_alignment, byteorder, data/<n>, then
// LibTorch's version and serialization id) into file. Containers are untagged: tagged ones (what
// torch::pickle_save writes) name torch.jit._pickle.restore_type_tag, which torch.load's weights_only refuses.
void write_archive(const c10::impl::GenericDict& dict, AtomicFile& file) {
  std::vector<char> pickle;
  torch::jit::Pickler pickler([&](const char* bytes, size_t n) { pickle.insert(pickle.end(), bytes, bytes + n); },
                              /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
                              /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(c10::IValue(dict));
  pickler.stop();
  // Our checksums replace the zip entries' CRC-32 (as torch.save's compute_crc32=False does): one pass less.
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t n) { return file.write(data, n); },
                                                /*compute_crc32=*/false);
  try {
    writer.writeRecord("data.pkl", pickle.data(), pickle.size());
    const std::string pickle_checksum = std::to_string(Crc32().update(pickle.data(), pickle.size()).value());
    writer.writeRecord(kPickleChecksumRecord, pickle_checksum.data(), pickle_checksum.size());
    writer.writeRecord(".format_version", "1", 1);
    writer.writeRecord(".storage_alignment", "64", 2);
    writer.writeRecord("byteorder", "little", 6);
    const auto& tensors = pickler.tensorData();
    for (size_t i = 0; i < tensors.size(); ++i) {
      const auto& storage = tensors[i].storage();
      writer.writeRecord("data/" + std::to_string(i), storage.data(), storage.nbytes());
    }
    writer.writeEndOfFile();
  } catch (...) {
    // The writer's destructor would finish the archive and throw again, out of a destructor.
    if (!writer.finalized()) {
      try {
        writer.writeEndOfFile();
      } catch (...) {
      }
    }
    throw;
  }
}

// ---- Reading -----------------------------------------------------------------------------------

std::string type_name(const c10::IValue& v) {
  if (v.isInt()) return "an int";
  if (v.isString()) return "a str";
  if (v.isTensor()) return "a tensor";
  if (v.isGenericDict()) return "a dict";
  if (v.isDouble()) return "a float";
  if (v.isBool()) return "a bool";
  if (v.isNone()) return "None";
  if (v.isList()) return "a list";
  if (v.isTuple()) return "a tuple";
  return std::string("a ") + v.tagKind();
}

// The unpickler's message without its backtrace; its internal asserts are a damaged file, not a bug to report.
std::string reason(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  std::string what = c10_error ? c10_error->what_without_backtrace() : e.what();
  if (what.find("INTERNAL ASSERT FAILED") != std::string::npos || what.find("report a bug") != std::string::npos)
    return "its data is damaged (the pickle record does not decode)";
  const auto newline = what.find('\n');
  return newline == std::string::npos ? what : what.substr(0, newline);
}

// The file's top-level dict, its tensors backed by their records (with_data) or by nothing (the header).
c10::impl::GenericDict unpickle_archive(const std::string& path, bool with_data, bool* pickle_verified) {
  std::error_code error;
  TORCH_CHECK(std::filesystem::is_regular_file(path, error), "cannot open checkpoint '", path,
              "': no such file (or not a file)");
  c10::IValue value;
  try {
    caffe2::serialize::PyTorchStreamReader reader(path);
    if (reader.hasRecord("byteorder")) {
      const auto [data, size] = reader.getRecord("byteorder");
      const std::string order(static_cast<const char*>(data.get()), size);
      TORCH_CHECK(order == "little", "its tensors are stored ", order, "-endian; this reader takes little-endian");
    }
    const auto [pickle, pickle_size] = reader.getRecord("data.pkl");
    if (reader.hasRecord(kPickleChecksumRecord)) {
      const auto [data, size] = reader.getRecord(kPickleChecksumRecord);
      const std::string stored(static_cast<const char*>(data.get()), size);
      const std::string computed = std::to_string(Crc32().update(pickle.get(), pickle_size).value());
      TORCH_CHECK(stored == computed, "its data.pkl record (the dict without the tensors' data) fails its checksum "
                  "(stored ", stored, ", computed ", computed, "): the file is damaged");
      *pickle_verified = true;
    }
    size_t position = 0;
    auto read = [&, data = static_cast<const char*>(pickle.get()), size = pickle_size](char* out, size_t n) {
      n = std::min(n, size - position);
      std::memcpy(out, data + position, n);
      position += n;
      return n;
    };
    // Record sizes by data pointer: the unpickler trusts data.pkl's element counts, we check them below.
    std::unordered_map<const void*, size_t> record_size;
    auto read_record = [&](const std::string& key) -> at::DataPtr {
      const std::string name = "data/" + key;
      TORCH_CHECK(reader.hasRecord(name), "the record '", name, "' of a tensor is missing");
      if (!with_data) return at::DataPtr(nullptr, at::Device(at::kCPU));
      auto [data, size] = reader.getRecord(name);
      record_size[data.get()] = size;
      return std::move(data);
    };
    // On the CPU whatever device data.pkl names.
    torch::jit::Unpickler unpickler(read, torch::jit::TypeResolver(), torch::jit::ObjLoader(), read_record,
                                    at::Device(at::kCPU));
    unpickler.set_version(reader.version());
    value = unpickler.parse_ivalue();
    if (with_data && value.isGenericDict()) {
      for (const auto& entry : value.toGenericDict()) {
        if (!entry.value().isTensor() || entry.value().toTensor().numel() == 0) continue;
        const auto& storage = entry.value().toTensor().storage();
        const auto it = record_size.find(storage.data());
        TORCH_CHECK(it != record_size.end() && storage.nbytes() <= it->second, "the tensor '",
                    entry.key().isString() ? entry.key().toStringRef() : "?", "' claims ", storage.nbytes(),
                    " bytes, more than its record holds");
      }
    }
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "'", path, "' is not a readable checkpoint: ", reason(e));
  }
  TORCH_CHECK(value.isGenericDict(), "'", path, "' is not a TinyTransformer checkpoint (not a dict but ",
              type_name(value), ")");
  return value.toGenericDict();
}

// The file's entries, sorted into a Checkpoint with every field's type checked; the scalar fields and the
// stored checksums on the side for verify_checksums.
struct Entries {
  Checkpoint ck;
  std::string format;
  std::map<std::string, c10::IValue> fields;        // scalar entries, checksums excluded
  std::map<std::string, torch::Tensor> tensors;     // every tensor by its key in the file
  std::optional<c10::impl::GenericDict> checksums;  // v2 only
  bool pickle_verified = false;                     // data.pkl's own checksum (v2) matched
};

Entries sort_entries(const std::string& path, const c10::impl::GenericDict& dict) {
  Entries out;
  auto refuse_type = [&](const std::string& key, const c10::IValue& v, const char* wanted) {
    TORCH_CHECK(false, "'", path, "': field \"", key, "\" is ", type_name(v), ", must be ", wanted);
  };
  const std::set<std::string> strings = {"format", "stage", "config", kRunIdKey, kKindKey};
  const std::set<std::string> ints = {"step", kRunStepKey};
  std::string config_text;
  for (const auto& entry : dict) {
    TORCH_CHECK(entry.key().isString(), "'", path, "' is not a TinyTransformer checkpoint (a key is ",
                type_name(entry.key()), ", not a str)");
    const std::string key = entry.key().toStringRef();
    const c10::IValue& v = entry.value();
    if (strings.count(key)) {
      if (!v.isString()) refuse_type(key, v, "a str");
      out.fields[key] = v;
    } else if (ints.count(key)) {
      if (!v.isInt()) refuse_type(key, v, "an int");
      out.fields[key] = v;
    } else if (key == kChecksumsKey) {
      if (!v.isGenericDict()) refuse_type(key, v, "a dict");
      out.checksums = v.toGenericDict();
    } else {
      if (!v.isTensor()) refuse_type(key, v, "a tensor");
      out.tensors[key] = v.toTensor();
    }
  }
  auto text = [&](const char* key) {
    auto it = out.fields.find(key);
    return it == out.fields.end() ? std::string() : it->second.toStringRef();
  };
  out.format = text("format");
  TORCH_CHECK(out.format == kCheckpointFormat || out.format == kCheckpointFormatV1, "'", path,
              "' is not a TinyTransformer checkpoint (format field ",
              out.format.empty() ? std::string("missing") : "\"" + out.format + "\"", ", must be ", kCheckpointFormat,
              " or ", kCheckpointFormatV1, ")");
  for (const char* required : {"stage", "step", "config"})
    TORCH_CHECK(out.fields.count(required), "'", path, "': field \"", required, "\" is missing");
  Checkpoint& ck = out.ck;
  ck.stage = text("stage");
  ck.run_id = text(kRunIdKey);
  ck.kind = text(kKindKey);
  ck.step = out.fields.at("step").toInt();
  if (out.fields.count(kRunStepKey)) ck.run_step = out.fields.at(kRunStepKey).toInt();
  for (const auto& [key, tensor] : out.tensors) {
    if (key == kCpuRngKey) {
      ck.cpu_rng_state = tensor;
    } else if (key.rfind(kExpAvgSq, 0) == 0) {
      ck.exp_avg_sq[key.substr(kExpAvgSq.size())] = tensor;
    } else if (key.rfind(kExpAvg, 0) == 0) {
      ck.exp_avg[key.substr(kExpAvg.size())] = tensor;
    } else {
      ck.weights[key] = tensor;
    }
  }
  return out;
}

// v2: the scalar fields always, the tensors' bytes with_data; v1 files have no checksums to verify.
void verify_checksums(const std::string& path, const Entries& e, bool with_data) {
  if (e.format == kCheckpointFormatV1) return;
  TORCH_CHECK(e.checksums, "'", path, "': field \"", kChecksumsKey, "\" is missing (a ", kCheckpointFormat,
              " file has one)");
  TORCH_CHECK(e.pickle_verified, "'", path, "': the record ", kPickleChecksumRecord, " is missing (a ",
              kCheckpointFormat, " file has one)");
  const std::string where = "'" + path + "': field \"" + kChecksumsKey + "\"";
  auto get = [&](const char* key) {
    TORCH_CHECK(e.checksums->contains(key), where, " has no \"", key, "\"");
    return e.checksums->at(key);
  };
  const c10::IValue algorithm = get("algorithm"), fields = get("fields"), tensors = get("tensors");
  TORCH_CHECK(algorithm.isString() && algorithm.toStringRef() == kChecksumAlgorithm, where,
              ": \"algorithm\" must be \"", kChecksumAlgorithm, "\"");
  TORCH_CHECK(fields.isInt(), where, ": \"fields\" is ", type_name(fields), ", must be an int");
  TORCH_CHECK(tensors.isGenericDict(), where, ": \"tensors\" is ", type_name(tensors), ", must be a dict");
  const int64_t computed_fields = fields_checksum(e.fields);
  TORCH_CHECK(computed_fields == fields.toInt(), "'", path,
              "' is damaged: its fields (format, stage, step, run_step, run_id, kind, config) fail their checksum "
              "(stored ",
              fields.toInt(), ", computed ", computed_fields, ")");
  std::map<std::string, int64_t> stored;
  for (const auto& entry : tensors.toGenericDict()) {
    TORCH_CHECK(entry.key().isString() && entry.value().isInt(), where,
                ": \"tensors\" must map tensor names (str) to checksums (int)");
    stored[entry.key().toStringRef()] = entry.value().toInt();
  }
  for (const auto& [key, tensor] : e.tensors)
    TORCH_CHECK(stored.count(key), "'", path, "' is damaged: tensor '", key, "' has no checksum");
  for (const auto& [key, checksum] : stored)
    TORCH_CHECK(e.tensors.count(key), "'", path, "' is damaged: tensor '", key,
                "' is missing (its checksum is there)");
  if (!with_data) return;
  const std::vector<std::pair<std::string, torch::Tensor>> list(e.tensors.begin(), e.tensors.end());
  const std::vector<int64_t> computed = tensor_checksums(list);
  for (size_t i = 0; i < list.size(); ++i)
    TORCH_CHECK(computed[i] == stored.at(list[i].first), "'", path, "' is damaged: tensor '", list[i].first,
                "' fails its checksum (stored ", stored.at(list[i].first), ", computed ", computed[i], ")");
}

RunConfig embedded_config(const std::string& path, const Entries& e) {
  const std::string origin = path + " (embedded config)";
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(e.fields.at("config").toStringRef());
  } catch (const nlohmann::json::exception& error) {
    TORCH_CHECK(false, "'", path, "': field \"config\" is not valid JSON: ", error.what());
  }
  try {
    return run_config_from_json(json, origin);
  } catch (const std::exception& error) {
    TORCH_CHECK(false, "'", path, "': field \"config\" is not a valid run config: ", error.what());
  }
}

// What is true of every checkpoint a run writes: the steps, the run state, and exactly the tensors the
// embedded model config implies, each of its shape.
void check_consistency(const std::string& path, const Checkpoint& ck) {
  const std::string file = "'" + path + "': ";
  TORCH_CHECK(ck.step >= 0, file, "field \"step\" is ", ck.step, ", must be >= 0");
  TORCH_CHECK(ck.run_step >= -1, file, "field \"run_step\" is ", ck.run_step,
              ", must be >= 0 (or -1: written without run state)");
  // The optimizer steps once per step of the run, on top of those of a --load-checkpoint start.
  TORCH_CHECK(ck.run_step <= ck.step, file, "field \"run_step\" (", ck.run_step, ") exceeds \"step\" (", ck.step,
              "): the optimizer steps at every step of the run");
  if (ck.run_step >= 0) {
    TORCH_CHECK(ck.cpu_rng_state.defined(), file, "tensor \"", kCpuRngKey, "\" is missing (run_step ", ck.run_step,
                " says the file holds run state)");
  } else {
    TORCH_CHECK(!ck.cpu_rng_state.defined(), file, "tensor \"", kCpuRngKey,
                "\" is there but \"run_step\" is not (the two come together)");
  }
  if (ck.cpu_rng_state.defined()) {
    const auto& rng = ck.cpu_rng_state;
    const int64_t expected = at::detail::getDefaultCPUGenerator().get_state().numel();
    TORCH_CHECK(rng.scalar_type() == torch::kByte && rng.dim() == 1 && rng.numel() == expected, file, "tensor \"",
                kCpuRngKey, "\" is ", dtype_name(rng.scalar_type()), " ", shape_text(rng.sizes()), ", must be uint8 [",
                expected, "] (LibTorch's CPU generator state)");
  }

  std::map<std::string, std::vector<int64_t>> expected;
  for (auto& [name, shape] : canonical_shapes(ck.config.model)) expected[name] = std::move(shape);
  const ModelConfig& m = ck.config.model;
  const std::string model = "the embedded config's model (" + std::to_string(m.n_layers) + " layers, hidden_dim " +
                            std::to_string(m.hidden_dim) + ", vocab_size " + std::to_string(m.vocab_size) +
                            (m.tie_embeddings ? ", tied embeddings)" : ", untied head)");
  for (const auto& [name, shape] : expected) {
    auto it = ck.weights.find(name);
    TORCH_CHECK(it != ck.weights.end(), file, "weight '", name, "' is missing; ", model, " has it");
    TORCH_CHECK(it->second.sizes() == c10::IntArrayRef(shape), file, "weight '", name, "' has shape ",
                shape_text(it->second.sizes()), ", ", model, " implies ", shape_text(shape));
    TORCH_CHECK(it->second.is_floating_point(), file, "weight '", name, "' is ", dtype_name(it->second.scalar_type()),
                ", must be a floating-point tensor");
  }
  for (const auto& [name, tensor] : ck.weights)
    TORCH_CHECK(expected.count(name), file, "tensor '", name, "' is not a weight of ", model);

  TORCH_CHECK(!ck.exp_avg.empty() || !ck.exp_avg_sq.empty() || ck.step == 0, file, "field \"step\" is ", ck.step,
              " but there are no optimizer moments (only a checkpoint written before the first step has none)");
  if (ck.exp_avg.empty() && ck.exp_avg_sq.empty()) return;
  for (const auto* moments : {&ck.exp_avg, &ck.exp_avg_sq}) {
    const std::string& prefix = moments == &ck.exp_avg ? kExpAvg : kExpAvgSq;
    for (const auto& [name, weight] : ck.weights) {
      auto it = moments->find(name);
      TORCH_CHECK(it != moments->end(), file, "optimizer moment '", prefix, name, "' is missing (every weight has ",
                  kExpAvg, "<name> and ", kExpAvgSq, "<name>)");
      TORCH_CHECK(it->second.sizes() == weight.sizes(), file, "optimizer moment '", prefix, name, "' has shape ",
                  shape_text(it->second.sizes()), ", its weight has ", shape_text(weight.sizes()));
      TORCH_CHECK(it->second.is_floating_point(), file, "optimizer moment '", prefix, name, "' is ",
                  dtype_name(it->second.scalar_type()), ", must be a floating-point tensor");
    }
    for (const auto& [name, tensor] : *moments)
      TORCH_CHECK(ck.weights.count(name), file, "optimizer moment '", prefix, name, "' belongs to no weight");
  }
}

// Everything but the tensors' checksums (with_data: those too).
Entries read_entries(const std::string& path, bool with_data) {
  bool pickle_verified = false;
  Entries e = sort_entries(path, unpickle_archive(path, with_data, &pickle_verified));
  e.pickle_verified = pickle_verified;
  verify_checksums(path, e, with_data);
  e.ck.config = embedded_config(path, e);
  check_consistency(path, e.ck);
  return e;
}

}  // namespace

std::vector<std::pair<std::string, std::vector<int64_t>>> canonical_shapes(const ModelConfig& m) {
  const int64_t d = m.hidden_dim, kv = m.n_kv_heads * m.head_dim(), ffn = m.intermediate_dim;
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  out.push_back({"model.embed_tokens.weight", {m.vocab_size, d}});
  for (int64_t i = 0; i < m.n_layers; ++i) {
    const std::string prefix = "model.layers." + std::to_string(i) + ".";
    out.push_back({prefix + "input_layernorm.weight", {d}});
    out.push_back({prefix + "self_attn.q_proj.weight", {d, d}});
    out.push_back({prefix + "self_attn.k_proj.weight", {kv, d}});
    out.push_back({prefix + "self_attn.v_proj.weight", {kv, d}});
    out.push_back({prefix + "self_attn.o_proj.weight", {d, d}});
    out.push_back({prefix + "post_attention_layernorm.weight", {d}});
    out.push_back({prefix + "mlp.gate_proj.weight", {ffn, d}});
    out.push_back({prefix + "mlp.up_proj.weight", {ffn, d}});
    out.push_back({prefix + "mlp.down_proj.weight", {d, ffn}});
  }
  out.push_back({"model.norm.weight", {d}});
  if (!m.tie_embeddings) out.push_back({"lm_head.weight", {m.vocab_size, d}});
  return out;
}

void write_checkpoint(const std::string& path, const Checkpoint& ck, bool overwrite) {
  TORCH_CHECK(overwrite || !std::filesystem::exists(path), "--save-checkpoint: file '", path,
              "' exists; pass --overwrite to replace it or choose another path");
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  if (ck.cpu_rng_state.defined()) tensors.emplace_back(kCpuRngKey, compact(ck.cpu_rng_state));
  for (const auto& [name, t] : ck.weights) tensors.emplace_back(name, compact(t));
  for (const auto& [name, t] : ck.exp_avg) tensors.emplace_back(kExpAvg + name, compact(t));
  for (const auto& [name, t] : ck.exp_avg_sq) tensors.emplace_back(kExpAvgSq + name, compact(t));

  std::map<std::string, c10::IValue> fields = {{"format", std::string(kCheckpointFormat)},
                                               {"stage", ck.stage},
                                               {"step", ck.step},
                                               {"config", to_json(ck.config).dump()}};
  if (ck.run_step >= 0) fields[kRunStepKey] = ck.run_step;
  if (!ck.run_id.empty()) fields[kRunIdKey] = ck.run_id;
  if (!ck.kind.empty()) fields[kKindKey] = ck.kind;

  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  for (const char* key : {"format", "stage", "step", "config", kRunStepKey, kRunIdKey, kKindKey})
    if (fields.count(key)) dict.insert(key, fields.at(key));
  for (const auto& [key, t] : tensors) dict.insert(key, t);
  c10::impl::GenericDict tensor_sums(c10::StringType::get(), c10::IntType::get());
  const std::vector<int64_t> sums = tensor_checksums(tensors);
  for (size_t i = 0; i < tensors.size(); ++i) tensor_sums.insert(tensors[i].first, sums[i]);
  c10::impl::GenericDict checksums(c10::StringType::get(), c10::AnyType::get());
  checksums.insert("algorithm", std::string(kChecksumAlgorithm));
  checksums.insert("fields", fields_checksum(fields));
  checksums.insert("tensors", tensor_sums);
  dict.insert(kChecksumsKey, checksums);

  AtomicFile file(path, "checkpoint");
  try {
    write_archive(dict, file);
  } catch (const std::exception& e) {
    file.fail(file.error() ? std::strerror(file.error()) : reason(e));
  }
  file.commit();
}

std::string checkpoint_temp_path(const std::string& path) { return temporary_path_for(path); }

Checkpoint read_checkpoint(const std::string& path) { return read_entries(path, /*with_data=*/true).ck; }

CheckpointHeader read_checkpoint_header(const std::string& path) {
  const Checkpoint ck = read_entries(path, /*with_data=*/false).ck;
  return {path, ck.stage, ck.step, ck.run_step, ck.run_id, ck.kind, ck.config};
}

void check_model_config(const Checkpoint& ck, const ModelConfig& model) {
  const auto mine = to_json(model);
  const auto theirs = to_json(ck.config.model);
  std::string diff;
  for (const auto& [key, value] : mine.items())
    if (theirs.at(key) != value)
      diff += "\n  model." + key + ": checkpoint has " + theirs.at(key).dump() + ", this run has " + value.dump();
  TORCH_CHECK(diff.empty(), "the checkpoint's model config does not match this run's:", diff);
}

void restore_weights(const Checkpoint& ck, Transformer& model) {
  check_model_config(ck, model->config());
  model->load_canonical_state(ck.weights);
}

}  // namespace tt
