// The result JSON every training run writes (schema in README.md, "Result files"): built from a run's
// RunRecord, checked, and written atomically. Also the statistics it reports.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/report/system_info.h"
#include "apps/train/loop.h"
#include "apps/train/trainer.h"

namespace tt {

constexpr int kResultSchemaVersion = 1;

struct Spread {
  double median = 0, p10 = 0, p90 = 0, min = 0, max = 0;
};
// Percentiles by linear interpolation between closest ranks; throws on an empty sample.
Spread spread(std::vector<double> values);
nlohmann::json to_json(const Spread& s);

// The result of a finished run: stage (with the attention library's backend choice), config, training
// settings, system, summary statistics, every loss and step time. `data` describes the training data.
// Evaluation and profile objects are added by the caller when the run had them.
nlohmann::json build_result(const Trainer& trainer, const RunRecord& record, const std::string& data,
                            const SystemInfo& system);

// The summary's energy fields from a reading (apps/train/energy.h): energy_j_per_step (joules over the
// reading's steps), tokens_per_joule, energy_note (the source, or why there is no figure) and energy_window
// (its steps, seconds, whether they were extra steps after the run, the counter's refresh period).
void set_energy_fields(nlohmann::json& summary, const EnergyReading& energy, double tokens_per_step);

// Throws std::runtime_error naming the first missing or mistyped field (path like "summary.step_ms.median").
void validate_result_json(const nlohmann::json& result);

// Writes JSON to path through a temporary file and a rename; refuses to replace an existing file unless
// overwrite is set. Creates the parent folder.
void write_json_atomically(const std::string& path, const nlohmann::json& value, bool overwrite);
nlohmann::json read_json_file(const std::string& path);

}  // namespace tt
