// Command line of the export_safetensors app: a checkpoint in; its weights out as a Hugging Face LLaMA
// safetensors file, with the config.json that transformers' LlamaForCausalLM.from_pretrained reads written
// beside it (in the output's folder). Kept in tt_cli (as generate_main is) so that tests run it in-process.
#pragma once

#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "models/checkpoint.h"

namespace tt {

// Returns the process exit code: 0 on success, 2 for bad flags or values (checked before any work), 1 when
// the checkpoint cannot be read or the files cannot be written.
int export_main(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

// The checkpoint's weights as LlamaForCausalLM names and lays them out, in `dtype`. Our RoPE rotates
// interleaved pairs (0,1), (2,3), ... of each head, HF's the two halves (rotate_half), so the rows of q_proj
// and k_proj are permuted within each head as HF's convert_llama_weights_to_hf.py does. A tied head has no
// lm_head.weight (tie_word_embeddings in the config makes HF share the embedding).
std::vector<std::pair<std::string, torch::Tensor>> hugging_face_weights(const Checkpoint& checkpoint,
                                                                         torch::Dtype dtype);
// LlamaConfig's fields for the model, torch_dtype from `dtype`.
nlohmann::json hugging_face_config(const ModelConfig& model, torch::Dtype dtype);

}  // namespace tt
