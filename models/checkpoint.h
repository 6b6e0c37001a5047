// Checkpoints as PyTorch's own zip archive, which Python's torch.load reads under its defaults
// (weights_only=True): one dict whose keys are the canonical weight names (Hugging Face LLaMA),
// "optimizer.exp_avg.<name>" and "optimizer.exp_avg_sq.<name>" for the AdamW moments, plus "step" (int),
// "stage" (str), "config" (the run config as a JSON string) and "format". Canonical names make a checkpoint
// portable between stages. Beside them, what an exact resume needs: "run_step" (steps of the run done, which
// is also its data position) and "rng.cpu" (the default CPU generator's state, uint8), and who wrote the file
// and why ("run_id", "kind"). "checksums" holds a CRC-32 of every tensor and one of the other fields, and a
// record beside data.pkl its CRC-32; all are checked on every read (docs/training.md says how to recompute
// them). This layer knows tensors by canonical name only; the training layer (apps/train/trainer.h) maps
// optimizer state to and from them.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "models/config.h"
#include "models/transformer.h"

namespace tt {

// v2: checksums, untagged containers (torch.load's weights_only reads them). v1 files (LibTorch's
// pickle_save, no checksums) are still read, unverified: they predate checksums.
constexpr const char* kCheckpointFormat = "tinytransformer-checkpoint-v2";
constexpr const char* kCheckpointFormatV1 = "tinytransformer-checkpoint-v1";

struct Checkpoint {
  RunConfig config;
  std::string stage;
  int64_t step = 0;
  std::map<std::string, torch::Tensor> weights;
  std::map<std::string, torch::Tensor> exp_avg, exp_avg_sq;  // empty when saved before any step
  int64_t run_step = -1;        // steps of the run done; -1 in checkpoints written before resume existed
  torch::Tensor cpu_rng_state;  // undefined in those too
  // Which run wrote the file and why, so that a checkpoint folder is only ever pruned of the current run's
  // own periodic files (apps/train/checkpointing.h). Empty in files written before runs had an identity.
  std::string run_id;
  std::string kind;  // "periodic", "last" (the run's final step), "stop" (on a signal), "saved" (--save-checkpoint)
};

// What a checkpoint says about itself, without its tensors: enough to decide whether a folder's file is
// this run's and where it stands.
struct CheckpointHeader {
  std::string path;
  std::string stage;
  int64_t step = 0;
  int64_t run_step = -1;
  std::string run_id;
  std::string kind;
  RunConfig config;
};

constexpr const char* kRunStepKey = "run_step";
constexpr const char* kCpuRngKey = "rng.cpu";
constexpr const char* kRunIdKey = "run_id";
constexpr const char* kKindKey = "kind";
constexpr const char* kChecksumsKey = "checksums";

// Writes atomically (temporary file, then rename). An existing file is replaced only with `overwrite`;
// otherwise the error names --save-checkpoint and --overwrite, as results do. A failed write (a full disk)
// removes the temporary file and throws naming the file.
void write_checkpoint(const std::string& path, const Checkpoint& checkpoint, bool overwrite);
// Reads and checks: every checksum (v2), field types, step >= 0, -1 <= run_step <= step, exactly the
// weights the embedded config implies with their shapes, optimizer moments for exactly those weights with
// their shapes, rng.cpu a uint8 vector. Every refusal names the file and the tensor or field.
Checkpoint read_checkpoint(const std::string& path);
// The temporary file write_checkpoint writes before it renames it to `path`.
std::string checkpoint_temp_path(const std::string& path);
// The fields above of the checkpoint at `path`, with the same checks except the tensors' checksums: reads
// only the archive's directory and its small data.pkl record, not the tensors' bytes.
CheckpointHeader read_checkpoint_header(const std::string& path);
// The canonical (Hugging Face LLaMA) weight names of a model of this config and their shapes, in the order of
// TransformerImpl::canonical_layout.
std::vector<std::pair<std::string, std::vector<int64_t>>> canonical_shapes(const ModelConfig& model);
// Throws naming each model field where the checkpoint's config differs from `model`.
void check_model_config(const Checkpoint& checkpoint, const ModelConfig& model);
// check_model_config, then the checkpoint's weights into the model.
void restore_weights(const Checkpoint& checkpoint, Transformer& model);

}  // namespace tt
