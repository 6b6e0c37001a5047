// Command line of the generate app: a checkpoint, a prompt and decoding options in; the continuation on
// `out`, progress and errors on `err`. Kept in tt_core (as stage_main is) so that tests run it in-process.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

namespace tt {

// Returns the process exit code: 0 on success, 2 for bad flags or values (the checkpoint file missing,
// an empty or too long prompt, ...), 1 when the checkpoint cannot be read or does not fit its model.
int generate_main(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace tt
