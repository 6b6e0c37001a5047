#include "apps/cli/export_cli.h"

#include <filesystem>
#include <fstream>
#include <ostream>
#include <stdexcept>

#include <cxxopts.hpp>

#include "apps/cli/command_line.h"
#include "models/atomic_file.h"
#include "models/safetensors.h"

namespace tt {
namespace {

cxxopts::Options make_options() {
  cxxopts::Options o("export_safetensors",
                     "Export a checkpoint's weights as a Hugging Face LLaMA safetensors file, with a config.json\n"
                     "beside it: LlamaForCausalLM.from_pretrained(<the output's folder>) loads them.");
  o.add_options()
      ("checkpoint", "checkpoint written by a stage (--save-checkpoint, --checkpoint-dir) (required)",
       cxxopts::value<std::string>())
      ("output", "the .safetensors file to write; config.json goes into the same folder (required)",
       cxxopts::value<std::string>())
      ("dtype", "fp32 | bf16: the exported weights' dtype", cxxopts::value<std::string>()->default_value("fp32"))
      ("overwrite", "replace an existing output file and config.json")
      ("help", "show this help");
  return o;
}

// Rows of a [heads * head_dim, in] projection from interleaved pairs to halves, within each head.
torch::Tensor interleaved_to_halves(const torch::Tensor& w, int64_t heads) {
  const int64_t rows = w.size(0), cols = w.size(1);
  return w.view({heads, rows / heads / 2, 2, cols}).transpose(1, 2).reshape({rows, cols});
}

int run(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  auto options = make_options();
  const auto parsed = parse_flags_with_dtype(options, args, out);
  if (!parsed) return 0;  // --help
  const cxxopts::ParseResult& r = parsed->flags;
  const Precision precision = parsed->precision;
  if (!r.count("checkpoint")) throw UsageError("--checkpoint FILE is required (see --help)");
  if (!r.count("output")) throw UsageError("--output FILE is required (see --help)");
  const auto checkpoint_path = r["checkpoint"].as<std::string>();
  const auto output = r["output"].as<std::string>();
  const bool overwrite = r.count("overwrite") > 0;
  if (!std::filesystem::is_regular_file(checkpoint_path))
    throw UsageError("--checkpoint: file '" + checkpoint_path + "' does not exist (or is not a file)");
  if (output.empty()) throw UsageError("--output is empty: give the .safetensors file to write");
  const std::string config_path = (std::filesystem::path(output).parent_path() / "config.json").string();
  if (std::filesystem::absolute(output).lexically_normal() == std::filesystem::absolute(config_path).lexically_normal())
    throw UsageError("--output '" + output + "' is the config.json written beside it: choose another name");
  if (auto refusal = refuse_output_file("--output", output, overwrite)) throw UsageError(*refusal);
  if (auto refusal = refuse_output_file("--output's config.json", config_path, overwrite)) throw UsageError(*refusal);

  const torch::Dtype dtype = precision == Precision::kBf16 ? torch::kBFloat16 : torch::kFloat;
  const Checkpoint ck = read_checkpoint(checkpoint_path);
  const auto weights = hugging_face_weights(ck, dtype);
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"},  // transformers refuses metadata without it
      {"tinytransformer.checkpoint", checkpoint_path},
      {"tinytransformer.stage", ck.stage},
      {"tinytransformer.step", std::to_string(ck.step)},
      {"tinytransformer.config", to_json(ck.config).dump()}};
  const auto folder = std::filesystem::path(output).parent_path();
  if (!folder.empty()) std::filesystem::create_directories(folder);
  write_safetensors(output, weights, metadata, overwrite);
  {
    AtomicFile file(config_path, "config.json");
    const std::string text = hugging_face_config(ck.config.model, dtype).dump(2) + "\n";
    file.write(text.data(), text.size());
    file.commit();
  }
  int64_t parameters = 0;
  for (const auto& [name, t] : weights) parameters += t.numel();
  out << "export_safetensors: " << weights.size() << " tensors (" << parameters << " parameters, "
      << (dtype == torch::kBFloat16 ? "bf16" : "fp32") << ") from '" << checkpoint_path << "' (" << ck.stage
      << ", step " << ck.step << ") to '" << output << "', config in '" << config_path << "'" << std::endl;
  (void)err;
  return 0;
}

}  // namespace

std::vector<std::pair<std::string, torch::Tensor>> hugging_face_weights(const Checkpoint& ck, torch::Dtype dtype) {
  const ModelConfig& m = ck.config.model;
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& [name, shape] : canonical_shapes(m)) {
    torch::Tensor w = ck.weights.at(name);
    const auto ends_with = [&](const std::string& suffix) {
      return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    if (ends_with("self_attn.q_proj.weight")) w = interleaved_to_halves(w, m.n_heads);
    if (ends_with("self_attn.k_proj.weight")) w = interleaved_to_halves(w, m.n_kv_heads);
    out.emplace_back(name, w.to(dtype).contiguous());
  }
  return out;
}

nlohmann::json hugging_face_config(const ModelConfig& m, torch::Dtype dtype) {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"vocab_size", m.vocab_size},
          {"hidden_size", m.hidden_dim},
          {"intermediate_size", m.intermediate_dim},
          {"num_hidden_layers", m.n_layers},
          {"num_attention_heads", m.n_heads},
          {"num_key_value_heads", m.n_kv_heads},
          {"head_dim", m.head_dim()},
          {"hidden_act", "silu"},
          {"max_position_embeddings", m.max_seq_len},
          {"rms_norm_eps", m.norm_eps},
          {"rope_theta", m.rope_theta},
          {"rope_scaling", nullptr},
          {"attention_bias", false},
          {"attention_dropout", 0.0},
          {"mlp_bias", false},
          {"initializer_range", m.init_std},
          {"tie_word_embeddings", m.tie_embeddings},
          {"use_cache", true},
          {"torch_dtype", dtype == torch::kBFloat16 ? "bfloat16" : "float32"}};
}

int export_main(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  return run_tool("export_safetensors", [&] { return run(args, out, err); }, err);
}

}  // namespace tt
