// fsdpp tokenize <text-file> <out.bin>: byte-level tokens (vocab 256), so any text becomes training data.
#include "commands.hpp"

#include "fsdpp/data/tokenize.hpp"

#include <mpi.h>

namespace fsdpp::app {

Command add_tokenize_command(CLI::App& app) {
  auto* cli = app.add_subcommand("tokenize", "Turn a text file into byte-level tokens (vocab 256) for data.source");
  auto paths = std::make_shared<std::pair<std::string, std::string>>();
  cli->add_option("text", paths->first, "Text file to read")->required();
  cli->add_option("out", paths->second, "Token file to write: .bin (GPT-2 format), .u16 or .u32")->required();
  return {cli, [paths](Runtime& rt) {
            // One writer; the others wait so that the job ends only when the file is complete.
            std::int64_t count = 0;
            if (rt.rank() == 0) count = tokenize_file(paths->first, paths->second);
            MPI_Barrier(rt.world());
            Log::info("wrote {} tokens (vocab 256) to {}; train on it with data.source={} model.vocab_size=256", count,
                      paths->second, paths->second);
            return 0;
          },
          [] { return false; }};
}

}  // namespace fsdpp::app
