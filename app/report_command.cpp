// fsdpp report <run-folder>: report.png (loss and validation loss, tokens/s, grad norm against step) and a short
// text summary, from <run>/metrics.jsonl. The plot is drawn by gnuplot (Debian's gnuplot-nox), run as an
// external program on a data file and a script written next to the report.
#include "commands.hpp"

#include "fsdpp/runtime/error.hpp"

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>

namespace fsdpp::app {
namespace {

struct Row {
  double step, loss, tokens_per_s, grad_norm;
  std::optional<double> val;
};

std::string plot_script(const std::string& data, const std::string& png, const std::string& title) {
  return fmt::format(
      "set terminal pngcairo size 1200,900 font ',10'\n"
      "set output '{}'\n"
      "set multiplot layout 3,1 title '{}'\n"
      "set xlabel 'step'\nset grid\n"
      "set ylabel 'loss'\n"
      "plot '{}' using 1:2 with lines title 'train loss', '' using 1:($5 == -1 ? NaN : $5) with linespoints "
      "title 'validation loss'\n"
      "set ylabel 'tokens/s'\nplot '{}' using 1:3 with lines title 'tokens/s'\n"
      "set ylabel 'grad norm'\nplot '{}' using 1:4 with lines title 'grad norm'\n"
      "unset multiplot\n",
      png, title, data, data, data);
}

}  // namespace

Command add_report_command(CLI::App& app) {
  auto* cli = app.add_subcommand("report", "Plot a run's metrics.jsonl into report.png, with a text summary");
  auto run = std::make_shared<std::string>();
  cli->add_option("run", *run, "The run folder (run.output) holding metrics.jsonl")->required();
  return {cli, [run](Runtime& rt) {
            if (rt.rank() != 0) return 0;  // one writer; the others have nothing to do
            namespace fs = std::filesystem;
            const fs::path folder(*run), metrics = folder / "metrics.jsonl";
            std::ifstream in(metrics);
            FSDPP_REQUIRE(in.good(), "cannot read {}: is '{}' a run folder (run.output)?", metrics.string(), *run);
            std::vector<Row> rows;
            std::string line;
            for (int number = 1; std::getline(in, line); ++number) {
              if (line.empty()) continue;
              nlohmann::json j;
              try {
                j = nlohmann::json::parse(line);
                Row r{j.at("step").get<double>(), j.at("loss").get<double>(), j.at("tokens_per_s").get<double>(),
                      j.at("grad_norm").get<double>(), std::nullopt};
                if (j.contains("val_loss")) r.val = j["val_loss"].get<double>();
                rows.push_back(r);
              } catch (const std::exception& e) {
                throw UsageError(fmt::format("{}:{}: not a metrics record: {}", metrics.string(), number, e.what()));
              }
            }
            FSDPP_REQUIRE(!rows.empty(), "{} holds no steps yet", metrics.string());
            const fs::path data = folder / "report.dat", script = folder / "report.gp", png = folder / "report.png";
            {
              std::ofstream out(data);
              for (const Row& r : rows)
                out << fmt::format("{} {} {} {} {}\n", r.step, r.loss, r.tokens_per_s, r.grad_norm, r.val ? *r.val : -1.0);
              std::ofstream(script) << plot_script(data.string(), png.string(), folder.filename().string());
            }
            const int rc = std::system(fmt::format("gnuplot '{}' 2> '{}'", script.string(), (folder / "report.log").string()).c_str());
            FSDPP_REQUIRE(rc == 0, "gnuplot failed (exit {}); see {}. Install it with apt-get install gnuplot-nox", rc,
                          (folder / "report.log").string());
            double best_val = 1e300, tokens = 0;
            for (const Row& r : rows) {
              if (r.val) best_val = std::min(best_val, *r.val);
              tokens += r.tokens_per_s;
            }
            Log::info("run {}: {} logged steps, last step {}, loss {:.4f} -> {:.4f}{}, mean {:.0f} tokens/s, last grad "
                      "norm {:.3f}\nwrote {}", folder.string(), rows.size(), rows.back().step, rows.front().loss,
                      rows.back().loss, best_val < 1e300 ? fmt::format(", best validation loss {:.4f}", best_val) : "",
                      tokens / rows.size(), rows.back().grad_norm, png.string());
            return 0;
          },
          [] { return false; }};
}

}  // namespace fsdpp::app
