#include "apps/train/run.h"

#include <c10/util/Exception.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <ostream>

#include "apps/results/output_files.h"
#include "apps/results/result_file.h"
#include "apps/train/data_parallel_step.h"
#include "apps/train/sharded_adamw.h"
#include "apps/train/device.h"
#include "apps/train/evaluation_report.h"
#include "apps/train/profiling.h"
#include "apps/train/stop_signal.h"
#include "apps/train/system_info.h"
#include "apps/train/trainer.h"
#include "apps/train/training_run.h"

namespace tt {
namespace {

std::string default_output(const std::string& stage, const RunConfig& c) {
  return "results/" + stage + "_" + c.name + "_" + to_string(c.training.dtype) + "_" + utc_timestamp(true) + ".json";
}

// What every rank must agree on (checked at start-up by check_same_run): output paths may differ.
nlohmann::json run_description(const StageSpec& spec, const RunConfig& config, const RunOptions& o, int world_size) {
  return {{"stage", spec.name},
          {"world_size", world_size},
          {"config", to_json(config)},
          {"flags",
           {{"no_graph", o.no_graph},
            {"load_checkpoint", o.load_checkpoint},
            {"resume", o.resume},
            {"checkpoint_every", o.checkpoint_every},
            // Whether, not where: rank 0 alone writes, but every rank joins a sharded optimizer's gathers.
            {"checkpoint_dir_given", !o.checkpoint_dir.empty()},
            {"save_checkpoint_given", !o.save_checkpoint.empty()},
            {"eval_data", o.eval_data},
            {"eval_every", o.eval_every},
            {"profile_steps", o.profile_steps},
            {"dist_timeout_s", o.dist_timeout_s},
            {"dp_sync", to_string(o.dp_sync.value_or(kDefaultGradientSync))},
            {"dp_embedding_grad", o.dp_embedding_grad ? to_string(*o.dp_embedding_grad) : "default"},
            {"zero_gather", to_string(o.zero_gather.value_or(kDefaultZeroGather))}}}};
}

constexpr const char* kShardOptimizerField = "config: field \"training.shard_optimizer\" = true (--shard-optimizer)";

// Refuses what data parallel cannot do.
void check_data_parallel_options(const DistributedEnv& env, const StageSpec& spec, const RunConfig& config,
                                 const RunOptions& o) {
  if (!env.enabled) {
    if (config.training.shard_optimizer)
      throw ConfigError(std::string(kShardOptimizerField) +
                        " applies to data-parallel runs (it splits the optimizer state across their GPUs), and this "
                        "process was not started by a launcher: use scripts/launch.sh --nproc N, or leave it out");
    if (o.dist_timeout_given || !o.scaling_baseline.empty() || o.dp_sync || o.dp_embedding_grad || o.zero_gather)
      throw ConfigError(std::string(o.dist_timeout_given          ? "--dist-timeout"
                                    : !o.scaling_baseline.empty() ? "--scaling-baseline"
                                    : o.dp_sync                   ? "--dp-sync"
                                    : o.dp_embedding_grad         ? "--dp-embedding-grad"
                                                                  : "--zero-gather") +
                        " applies to data-parallel runs, and this process was not started by a launcher (no RANK/"
                        "WORLD_SIZE, OMPI_COMM_WORLD_* or SLURM_PROCID variables): use scripts/launch.sh --nproc N");
    return;
  }
  if (o.eval_only) throw ConfigError("--eval-only is not allowed under a data-parallel launcher: run it as one process");
  if (o.zero_gather && !config.training.shard_optimizer)
    throw ConfigError(std::string("--zero-gather applies to a sharded optimizer (") + kShardOptimizerField +
                      "), which this run does not have: without it every rank updates all the weights");
  if (config.training.shard_optimizer) {
    if (spec.optimizer == OptimizerKind::kTorchAdamW)
      throw ConfigError(std::string(kShardOptimizerField) + " is not allowed for " + spec.name + ", whose optimizer (" +
                        implementation(spec.optimizer).name + ") steps parameter by parameter: ZeRO-1 updates slices " +
                        "with a multi-tensor AdamW (" + implementation(OptimizerKind::kAtenFusedAdamW).name + ", " +
                        implementation(OptimizerKind::kOurAdamW).name + "; v2_fused to v4_ultra)");
    if (o.dp_sync.value_or(kDefaultGradientSync) != GradientSync::kLayers)
      throw ConfigError(std::string(kShardOptimizerField) + " is not allowed with --dp-sync " +
                        to_string(*o.dp_sync) + ": the Reducer all-reduces whole gradients, the sharded optimizer " +
                        "needs each layer's reduce-scattered (--dp-sync layers, the default)");
  }
  if (o.dp_embedding_grad == EmbeddingGradExchange::kRows &&
      o.dp_sync.value_or(kDefaultGradientSync) == GradientSync::kReducer)
    throw ConfigError("--dp-embedding-grad rows is not allowed with --dp-sync reducer: the Reducer averages whole "
                      "gradients in its buckets (use --dp-sync layers, the default)");
  if (config.training.device == "cpu")
    throw ConfigError("config: field \"training.device\" = \"cpu\" is not allowed under a data-parallel launcher (" +
                      env.source + " variables are set): data parallel runs one process per GPU over NCCL");
  if (o.scaling_baseline.empty()) return;
  const nlohmann::json base = read_json_file(o.scaling_baseline);
  validate_result_json(base);
  auto refuse = [&](const std::string& field, const nlohmann::json& theirs, const nlohmann::json& ours) {
    if (theirs != ours)
      throw ConfigError("--scaling-baseline '" + o.scaling_baseline + "': its " + field + " is " + theirs.dump() +
                        ", this run's is " + ours.dump() + "; the baseline must be a 1-GPU run of the same stage, "
                        "model, dtype and per-GPU batch");
  };
  refuse("stage.name", base["stage"]["name"], spec.name);
  refuse("config.model", base["config"]["model"], to_json(config.model));
  refuse("training.dtype", base["training"]["dtype"], to_string(config.training.dtype));
  refuse("training.batch_size", base["training"]["batch_size"], config.training.batch_size);
  refuse("training.seq_len", base["training"]["seq_len"], config.training.seq_len);
  refuse("distributed.world_size", base.contains("distributed") ? base["distributed"]["world_size"] : nlohmann::json(1),
         1);
}

void fill_scaling_efficiency(nlohmann::json& result, const std::string& baseline_path) {
  const nlohmann::json base = read_json_file(baseline_path);
  auto& d = result["distributed"];
  const double base_tokens = base["summary"]["tokens_per_s"].get<double>();
  d["scaling_efficiency"] = d["total_tokens_per_s"].get<double>() / (d["world_size"].get<double>() * base_tokens);
  d["scaling_baseline"] = {{"result", baseline_path}, {"tokens_per_s", base_tokens}};
}

// Every file the run would write, under one policy: never replaced without --overwrite; and --save-checkpoint
// not inside the checkpoint folder under a name of the folder's own form, where it would be taken for one of
// the run's checkpoints (and written over by one, or pruned).
void check_output_files(const RunPlan& p) {
  if (!p.writes_files) return;
  const RunOptions& o = p.options;
  for (const auto& refusal :
       {refuse_output_file("--output file", p.output, o.overwrite),
        refuse_output_file("--profile trace", o.profile_steps > 0 ? p.trace : "", o.overwrite),
        refuse_output_file("--save-checkpoint file", o.save_checkpoint, o.overwrite),
        refuse_output_folder("--checkpoint-dir", o.checkpoint_dir)})
    if (refusal) throw ConfigError(*refusal);
  if (o.save_checkpoint.empty() || o.checkpoint_dir.empty()) return;
  namespace fs = std::filesystem;
  const fs::path saved = fs::absolute(o.save_checkpoint).lexically_normal();
  const fs::path folder = fs::absolute(o.checkpoint_dir).lexically_normal();
  std::error_code error;
  const bool inside = saved.parent_path() == folder || fs::equivalent(saved.parent_path(), folder, error);
  if (inside && is_checkpoint_name(saved.filename().string()))
    throw ConfigError("--save-checkpoint '" + o.save_checkpoint + "' is inside --checkpoint-dir '" + o.checkpoint_dir +
                      "' under a name of the form step_<N>.pt, which that folder's checkpoints use: choose another "
                      "name or folder");
}

}  // namespace

StageSpec effective_stage(const StageSpec& stage, const RunOptions& options, const DistributedEnv& dist) {
  StageSpec spec = stage;
  if (options.no_graph) {
    if (spec.step != StepKind::kGraph)
      throw ConfigError("--no-graph applies to stages that capture their step as a graph (v4_ultra); " + spec.name +
                        " runs its step eagerly already");
    spec.step = StepKind::kEager;
    spec.summary += "; this run: --no-graph, the same kernels launched eagerly";
  }
  if (options.pitfall) spec = stages::with_pitfall(spec, *options.pitfall);
  if (dist.enabled && spec.step == StepKind::kGraph) {
    if (options.dp_sync.value_or(kDefaultGradientSync) == GradientSync::kReducer) {
      spec.step = StepKind::kEager;
      spec.summary += "; this run: data parallel with --dp-sync reducer, the step runs eagerly (the Reducer's "
                      "bucket bookkeeping runs on the host during the backward, which a graph replay cannot repeat)";
    } else {
      spec.summary += "; this run: data parallel, the gradients' collectives per layer captured in the graph";
    }
  }
  return spec;
}

std::optional<std::string> hardware_queues_needed(const StageSpec& stage, const RunConfig& config,
                                                  const RunOptions& options, const DistributedEnv& dist) {
#if defined(USE_ROCM) || defined(TT_BACKEND_HIP)
  // HIP ignores CUDA's variable; its own (GPU_MAX_HW_QUEUES) has not been measured with this overlap.
  (void)stage, (void)config, (void)options, (void)dist;
  return std::nullopt;
#endif
  if (!dist.enabled || !config.training.shard_optimizer || config.training.device == "cpu") return std::nullopt;
  if (options.zero_gather.value_or(kDefaultZeroGather) != ZeroGather::kForward || hardware_queues()) return std::nullopt;
  // A run that plan_run will refuse is not restarted first: its refusal comes at once.
  try {
    check_data_parallel_options(dist, effective_stage(stage, options, dist), config, options);
  } catch (const ConfigError&) {
    return std::nullopt;
  }
  return "32";
}

RunPlan plan_run(const StageSpec& stage, const RunConfig& config, const RunOptions& options,
                 const DistributedEnv& dist) {
  RunPlan p;
  p.spec = effective_stage(stage, options, dist);
  p.config = config;
  if (p.config.training.optimizer_state_dtype != Precision::kFp32 && p.spec.optimizer != OptimizerKind::kOurAdamW)
    throw ConfigError(std::string("config: field \"training.optimizer_state_dtype\" = \"") +
                      to_string(p.config.training.optimizer_state_dtype) + "\" is not allowed for " + p.spec.name +
                      ", whose optimizer (" + implementation(p.spec.optimizer).name +
                      ") keeps fp32 moments: bf16 moments are our AdamW's (v4_ultra)");
  // The overlap is our AdamW's. Under data parallel a layer's update must wait for its gradients' average: with an
  // all-reduce per layer it waits for that layer's (DataParallelStep); the Reducer's buckets and ZeRO-1's
  // reduce-scatter do not follow the layers, and there the update stays after the backward.
  if (p.config.training.optimizer_overlap) {
    const auto off = [&](const std::string& why) {
      p.config.training.optimizer_overlap = false;
      p.spec.summary += "; this run: the optimizer updates after the backward (" + why + ")";
    };
    if (p.spec.optimizer != OptimizerKind::kOurAdamW)
      off("the overlap is " + std::string(implementation(OptimizerKind::kOurAdamW).name) + "'s; " + p.spec.name +
          " runs " + implementation(p.spec.optimizer).name);
    else if (dist.enabled && p.config.training.shard_optimizer)
      off("ZeRO-1's sharded optimizer updates after its reduce-scatters");
    else if (dist.enabled && options.dp_sync.value_or(kDefaultGradientSync) != GradientSync::kLayers)
      off("c10d's Reducer averages buckets, not layers");
  }
  if (p.config.training.shard_optimizer)
    p.spec.summary += "; this run: ZeRO-1, each rank keeps and updates 1/" + std::to_string(dist.world_size) +
                      " of the optimizer state (gradients reduce-scattered, weights all-gathered)";
  p.options = options;
  p.dist = dist;
  p.dp_sync = options.dp_sync.value_or(kDefaultGradientSync);
  p.dp_embedding_grad = options.dp_embedding_grad.value_or(
      p.dp_sync == GradientSync::kLayers ? EmbeddingGradExchange::kRows : EmbeddingGradExchange::kDense);
  check_data_parallel_options(dist, p.spec, config, options);
  p.writes_files = dist.rank == 0;  // data parallel: rank 0 alone writes results and checkpoints
  p.output = options.output.empty()
                 ? default_output(p.spec.name +
                                      (p.spec.pitfall ? std::string("_") + stages::pitfall(*p.spec.pitfall).name : "") +
                                      (options.eval_only ? "_eval" : ""),
                                  config)
                 : options.output;
  p.trace = trace_path_for(p.output);
  check_output_files(p);
  // A missing GPU is a usage error here, before any work.
  const bool on_gpu = resolve_device(config.training.device).is_cuda();
  const bool graphed = p.spec.step == StepKind::kGraph && !options.eval_only && on_gpu;
  if (graphed) require_graph_warmup(p.spec, config.training);
  std::optional<CheckpointHeader> resumed;
  if (!options.resume.empty()) {
    try {
      p.resume_from = read_checkpoint(options.resume);
    } catch (const c10::Error& e) {
      throw ConfigError("--resume: " + std::string(e.what_without_backtrace()));
    }
    check_resumable(*p.resume_from, options.resume, p.spec.name, config, graphed);
    const Checkpoint& ck = *p.resume_from;
    resumed = CheckpointHeader{options.resume, ck.stage, ck.step, ck.run_step, ck.run_id, ck.kind, ck.config};
  }
  const CheckpointPolicy policy{options.checkpoint_dir, options.checkpoint_every, options.keep_checkpoints};
  // Rank 0 alone writes checkpoints; the others keep the policy only to know that there are some.
  p.checkpoints = p.writes_files ? check_checkpoint_folder(policy, resumed) : RunCheckpoints(policy, "");
  return p;
}

RunOutcome execute_run(RunPlan plan, std::ostream& log) {
  const RunConfig& config = plan.config;
  const RunOptions& options = plan.options;
  const StageSpec& spec = plan.spec;
  std::unique_ptr<DistributedContext> context;
  if (plan.dist.enabled) {
    try {
      DistributedOptions dist_options;
      dist_options.timeout = std::chrono::seconds(options.dist_timeout_s);
      dist_options.graphed_collectives = spec.step == StepKind::kGraph;  // the per-layer collectives in the graph
      context = std::make_unique<DistributedContext>(plan.dist, dist_options);
      if (context->waits_for_graphs() && plan.dist.rank == 0)
        log << "[note] NCCL_GRAPH_MIXING_SUPPORT=" << std::getenv("NCCL_GRAPH_MIXING_SUPPORT")
            << ": the graph's collectives without NCCL's guards for mixing graphs and other launches (a faster "
               "step), so each collective outside the graph (stop vote, evaluation, checkpoints) first waits for "
               "the GPU (docs/multi-gpu.md)"
            << std::endl;
      check_same_run(context->store(), plan.dist.rank, plan.dist.world_size,
                     run_description(spec, config, options, plan.dist.world_size));
    } catch (const ConfigError& e) {
      throw RunError(2, "rank " + std::to_string(plan.dist.rank) + ": " + error_message(e));
    } catch (const std::exception& e) {
      throw RunError(1, "rank " + std::to_string(plan.dist.rank) + ": " + error_message(e));
    }
  }
  auto fail = [&](int code, const std::string& message) {
    if (context) context->abort();
    return RunError(code, (context ? "rank " + std::to_string(plan.dist.rank) + ": " : "") + message);
  };
  torch::Device device = torch::kCPU;
  RunOutcome outcome;
  outcome.output = plan.output;
  try {
    // The data first, then the model: a data file's refusal comes before any GPU memory is taken.
    std::optional<EvalData> eval_data;
    if (!options.eval_data.empty()) eval_data = load_eval_data(options.eval_data, config.training.seq_len);
    device = context ? context->device() : resolve_device(config.training.device);
    if (options.eval_only) {
      outcome.result = evaluate_checkpoint(spec, config, options.load_checkpoint, *eval_data, device, log);
      write_json_atomically(plan.output, outcome.result, options.overwrite);
      return outcome;
    }
    Trainer trainer(spec, config, device,
                    config.training.shard_optimizer
                        ? sharded_adamw(*context, spec.optimizer, options.zero_gather.value_or(kDefaultZeroGather))
                        : OptimizerMaker());
    if (!options.load_checkpoint.empty()) {
      // A file that is no checkpoint, or one of another model, is the user's input: exit 2, as --resume's.
      try {
        trainer.load_checkpoint(options.load_checkpoint);
      } catch (const std::exception& e) {
        throw fail(2, "--load-checkpoint: " + error_message(e));
      }
    }
    RunExtras extras;
    if (plan.resume_from) {
      extras.first_step = trainer.resume(*plan.resume_from);
      plan.resume_from.reset();  // its tensors are in the model and optimizer now
    }
    if (context) {
      broadcast_weights(*context, trainer.model());
      // A graphed stage captures at the same step as without data parallel (after a resume too).
      const int64_t capture_at = trainer.graphed()
                                     ? trainer.first_measured_step(extras.first_step) - extras.first_step - 1
                                     : -1;
      trainer.use_runner(std::make_unique<DataParallelStep>(*context, trainer.model(), trainer.optimizer(),
                                                            config.training.grad_accum_steps, plan.dp_sync,
                                                            capture_at,
                                                            plan.dp_embedding_grad == EmbeddingGradExchange::kRows));
    }
    extras.distributed = context.get();
    extras.eval_data = std::move(eval_data);
    extras.eval_every = options.eval_every;
    if (options.profile_steps > 0) extras.profile = {options.profile_steps, plan.trace};
    extras.checkpoints = plan.checkpoints;
    // The checkpoint holds the last counted step (or the stop's): written before the extra steps of --profile
    // and of the energy figure (apps/train/training_run.h).
    extras.after_last_counted_step = [&](int64_t steps_done) {
      if (options.save_checkpoint.empty()) return;
      if (!plan.writes_files) return trainer.join_checkpoint();  // a sharded optimizer gathers on every rank
      trainer.save_checkpoint(options.save_checkpoint, options.overwrite, steps_done,
                              {plan.checkpoints.run_id(), kSavedCheckpoint});
      log << "checkpoint written to " << options.save_checkpoint << std::endl;
    };
    // Installed for the training only: before it a signal ends the process as usual (nothing to save yet).
    StopSignalGuard stop_on_signal;
    std::unique_ptr<StopVote> vote;
    if (context) vote = std::make_unique<StopVote>(*context);
    extras.stop_requested = [&vote] {
      const bool mine = stop_signal_received() != 0;
      return vote ? (*vote)(mine) : mine;
    };
    nlohmann::json result = run_training(trainer, extras, log);
    // 128 + the signal, the shell's code for a process the signal ended (ranks stopped by another rank's
    // signal report SIGTERM's).
    const int received = stop_signal_received();
    outcome.exit_code = result["interrupted"].get<bool>() ? 128 + (received ? received : SIGTERM) : 0;
    if (!plan.writes_files) return outcome;
    if (!options.scaling_baseline.empty() && !result["summary"].is_null())
      fill_scaling_efficiency(result, options.scaling_baseline);
    write_json_atomically(plan.output, result, options.overwrite);
    outcome.result = std::move(result);
    return outcome;
  } catch (const RunError&) {
    throw;
  } catch (const c10::OutOfMemoryError& e) {
    const auto mem = peak_memory(device);
    throw fail(3, "out of GPU memory on config '" + config.name + "' (batch " +
                      std::to_string(config.training.batch_size) + ", seq " + std::to_string(config.training.seq_len) +
                      ", hidden " + std::to_string(config.model.hidden_dim) + ", layers " +
                      std::to_string(config.model.n_layers) + ", " + to_string(config.training.dtype) +
                      "): the GPU has " + std::to_string(total_device_memory(device) >> 20) +
                      " MB, peak allocated by this run " + std::to_string(mem.peak_allocated_bytes >> 20) +
                      " MB. No result file was written. Reduce --batch-size or --seq-len.\nLibTorch said: " +
                      e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw fail(1, error_message(e));
  }
}

}  // namespace tt
