// The result JSON every training run writes, built from the run: its trainer and RunRecord. The format itself
// (schema, checks, reading and writing, the spread statistics) is apps/results/result_file.h, which needs no
// trainer and no LibTorch.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/train/system_info.h"
#include "apps/results/result_file.h"
#include "apps/train/loop.h"
#include "apps/train/trainer.h"

namespace tt {

// The result of a finished run: stage (with the attention library's backend choice), config, training
// settings, system, summary statistics, every loss and step time. `data` describes the training data.
// Evaluation and profile objects are added by the caller when the run had them.
nlohmann::json build_result(const Trainer& trainer, const RunRecord& record, const std::string& data,
                            const SystemInfo& system);

// The summary's energy fields from a reading (apps/train/energy.h): energy_j_per_step (joules over the
// reading's steps), tokens_per_joule, energy_note (the source, or why there is no figure) and energy_window
// (its steps, seconds, whether they were extra steps after the run, the counter's refresh period).
void set_energy_fields(nlohmann::json& summary, const EnergyReading& energy, double tokens_per_step);

}  // namespace tt
